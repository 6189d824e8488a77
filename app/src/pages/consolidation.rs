//! Consolidation: plan moves that free whole GPUs or hosts of a pool, see them as before and
//! after GPU bars, execute (start before stop, one move at a time) or cancel; and what the
//! pool would hold with right-sized budgets.

use crate::access::{Declaration, guard};
use crate::components::{ErrorList, RoleHint, measured_text};
use crate::live::use_live;
use leptos::prelude::*;
use leptos_meta::Title;
use tessera_model::MiB;
use tessera_model::consolidation::{ConsolidationPlan, MoveState, PlanStatus};
use tessera_model::fit::PoolFit;

#[server]
pub async fn list_consolidation() -> Result<(Vec<String>, Vec<ConsolidationPlan>), ServerFnError> {
    use crate::data::ssr::{control, failed};
    let control = control()?;
    let pools = control
        .views()
        .list_pools()
        .await
        .map_err(failed)?
        .into_iter()
        .map(|p| p.name.to_string())
        .collect();
    Ok((
        pools,
        control
            .deployments()
            .consolidation_plans()
            .await
            .map_err(failed)?,
    ))
}

guard!(ListConsolidation, Declaration::VIEW);

#[server]
pub async fn get_pool_fit(pool: String) -> Result<PoolFit, ServerFnError> {
    use crate::data::ssr::{control, failed};
    control()?.views().pool_fit(&pool).await.map_err(failed)
}

guard!(GetPoolFit, Declaration::VIEW);

#[server]
pub async fn make_plan(pool: String, goal: String) -> Result<String, ServerFnError> {
    use crate::data::ssr::{control, failed};
    let plan = control()?
        .deployments()
        .plan_consolidation(&tessera_model::consolidation::PlanInput { pool, goal })
        .await
        .map_err(failed)?;
    Ok(plan.id)
}

guard!(MakePlan, Declaration::OPERATE);

/// Executes (`run = true`) or cancels a plan.
#[server]
pub async fn run_plan(id: String, run: bool) -> Result<(), ServerFnError> {
    use crate::data::ssr::{control, failed};
    let control = control()?;
    if run {
        control
            .deployments()
            .execute_consolidation_plan(&id)
            .await
            .map_err(failed)?;
    } else {
        control
            .deployments()
            .cancel_consolidation_plan(&id)
            .await
            .map_err(failed)?;
    }
    Ok(())
}

guard!(RunPlan, Declaration::OPERATE);

#[component]
pub fn ConsolidationPage() -> impl IntoView {
    let live = use_live();
    let make = Action::new(|(p, g): &(String, String)| make_plan(p.clone(), g.clone()));
    let run = Action::new(|(id, r): &(String, bool)| run_plan(id.clone(), *r));
    let data = Resource::new(
        move || (live(), make.version().get(), run.version().get()),
        |_| list_consolidation(),
    );
    let operate = crate::access::allowed::<MakePlan>();
    let may_run = crate::access::allowed::<RunPlan>();
    let pool = RwSignal::new(String::new());
    let goal = RwSignal::new("gpus".to_owned());
    // On request: re-packing a pool takes a while, and its fit moves slowly.
    let pool_fit = Action::new(|p: &String| get_pool_fit(p.clone()));
    view! {
        <Title text="Consolidation" />
        <div class="page-head">
            <h1>"Consolidation"</h1>
            <p class="lede">"Churn leaves GPUs partly used. A plan moves tasks so whole GPUs (or hosts) come free: computed by the placement engine, honouring every service's constraints and deployment limits, and carried out one move at a time, each replacement running before its original stops."</p>
        </div>
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            <ErrorBoundary fallback=|errors| view! { <ErrorList errors /> }>
                {move || Suspend::new(async move {
                    data.await.map(|(pools, plans)| {
                        if pool.get_untracked().is_empty()
                            && let Some(first) = pools.first()
                        {
                            pool.set(first.clone());
                        }
                        let latest = plans.first().cloned();
                        let older = plans.iter().skip(1).cloned().collect::<Vec<_>>();
                        view! {
                            <section class="panel controls">
                                <form on:submit=move |ev| {
                                    ev.prevent_default();
                                    make.dispatch((pool.get_untracked(), goal.get_untracked()));
                                }>
                                    <label>"Pool "
                                        <select name="pool" on:change=move |ev| pool.set(event_target_value(&ev))>
                                            {pools.iter().map(|p| {
                                                let selected = *p == pool.get_untracked();
                                                view! { <option value=p.clone() selected=selected>{p.clone()}</option> }
                                            }).collect_view()}
                                        </select>
                                    </label>
                                    <label>"Goal "
                                        <select name="goal" on:change=move |ev| goal.set(event_target_value(&ev))>
                                            <option value="gpus" selected=true>"free whole GPUs"</option>
                                            <option value="hosts">"free whole hosts"</option>
                                        </select>
                                    </label>
                                    <button type="submit" class="primary" title=move || operate.get() disabled=move || operate.get().is_some()>"Plan"</button>
                                </form>
                                <RoleHint reason=operate />
                                {move || make.value().get().and_then(Result::err).map(|e| view! { <p class="field-error" role="alert">{e.to_string()}</p> })}
                                {move || run.value().get().and_then(Result::err).map(|e| view! { <p class="field-error" role="alert">{e.to_string()}</p> })}
                            </section>
                            {latest.map(|p| view! { <PlanView plan=p run operate=may_run /> })}
                            {(!older.is_empty()).then(|| view! {
                                <section class="panel">
                                    <h2>"Earlier plans"</h2>
                                    <table class="table plans">
                                        <thead><tr><th>"Plan"</th><th>"Pool"</th><th>"Goal"</th><th>"Status"</th><th>"Moves"</th><th>"Frees"</th><th>"Created"</th></tr></thead>
                                        <tbody>
                                            {older.into_iter().map(|p| view! {
                                                <tr>
                                                    <td><code>{p.id[..8.min(p.id.len())].to_owned()}</code></td>
                                                    <td>{p.pool.clone()}</td>
                                                    <td>{p.goal.clone()}</td>
                                                    <td>{p.status.as_str()}</td>
                                                    <td>{p.moves.len()}</td>
                                                    <td>{frees_text(&p)}</td>
                                                    <td>{p.created_at.short()}</td>
                                                </tr>
                                            }).collect_view()}
                                        </tbody>
                                    </table>
                                </section>
                            })}
                        }
                    })
                })}
            </ErrorBoundary>
        </Transition>
        <section class="panel controls">
            <button type="button" on:click=move |_| { pool_fit.dispatch(pool.get_untracked()); }>
                "Show the pool with right-sized budgets"
            </button>
            {move || match pool_fit.value().get() {
                Some(Ok(f)) => view! { <PoolFitView fit=f /> }.into_any(),
                Some(Err(e)) => view! { <p class="field-error" role="alert">{e.to_string()}</p> }.into_any(),
                None => ().into_any(),
            }}
        </section>
    }
}

fn frees_text(p: &ConsolidationPlan) -> String {
    if p.goal == "hosts" {
        format!("{} host(s)", p.frees_hosts.len())
    } else {
        format!("{} GPU(s)", p.frees_gpus.len())
    }
}

#[component]
fn PlanView(
    plan: ConsolidationPlan,
    run: Action<(String, bool), Result<(), ServerFnError>>,
    operate: Signal<Option<String>>,
) -> impl IntoView {
    let (id1, id2) = (plan.id.clone(), plan.id.clone());
    let b = plan.density_before;
    let a = plan.density_after;
    let summary = format!(
        "Pool {} · goal: free whole {} · {} move(s) free {} · GPUs in use {} → {} · tasks per GPU in use {:.2} → {:.2}",
        plan.pool,
        plan.goal,
        plan.moves.len(),
        if plan.goal == "hosts" {
            if plan.frees_hosts.is_empty() {
                "nothing".to_owned()
            } else {
                plan.frees_hosts.join(", ")
            }
        } else if plan.frees_gpus.is_empty() {
            "nothing".to_owned()
        } else {
            plan.frees_gpus.join(", ")
        },
        b.gpus_in_use,
        a.gpus_in_use,
        b.tasks_per_gpu_in_use,
        a.tasks_per_gpu_in_use,
    );
    let can_run = plan.status == PlanStatus::Planned && !plan.moves.is_empty();
    let can_cancel = matches!(plan.status, PlanStatus::Planned | PlanStatus::Executing);
    let bars = plan
        .gpus
        .iter()
        .map(|g| {
            let cap = g.capacity_mib.max(1) as f64;
            let before = 100.0 * g.before_mib as f64 / cap;
            let after = 100.0 * g.after_mib as f64 / cap;
            let freed = g.after_mib == 0;
            view! {
                <li class=if freed { "plan-gpu freed" } else { "plan-gpu" }>
                    <span class="gpu-index">{format!("{}/GPU {}", g.host, g.index)}</span>
                    <div class="gpu-bars">
                        <div class="bar" aria-label=format!("before: {} of {}", measured_text(MiB(g.before_mib)), measured_text(MiB(g.capacity_mib)))>
                            <span class="bar-fill before" style=format!("width: {before:.1}%")></span>
                        </div>
                        <div class="bar" aria-label=format!("after: {} of {}", measured_text(MiB(g.after_mib)), measured_text(MiB(g.capacity_mib)))>
                            <span class="bar-fill after" style=format!("width: {after:.1}%")></span>
                        </div>
                    </div>
                    <span class="gpu-mem">{format!("{} → {}", measured_text(MiB(g.before_mib)), measured_text(MiB(g.after_mib)))}{freed.then_some(" · freed")}</span>
                </li>
            }
        })
        .collect_view();
    view! {
        <section class="panel plan" data-plan=plan.id.clone() data-status=plan.status.as_str()>
            <div class="fit-head">
                <h2>{format!("Plan {} — {}", &plan.id[..8.min(plan.id.len())], plan.status.as_str())}</h2>
                <div class="actions">
                    <button class="primary" title=move || operate.get() disabled=move || !can_run || operate.get().is_some()
                        on:click=move |_| { run.dispatch((id1.clone(), true)); }>"Execute"</button>
                    <button title=move || operate.get() disabled=move || !can_cancel || operate.get().is_some()
                        on:click=move |_| { run.dispatch((id2.clone(), false)); }>"Cancel"</button>
                </div>
            </div>
            <p class="summary">{summary}</p>
            {plan.message.clone().map(|m| view! { <p class="notice" role="status">{m}</p> })}
            {(!plan.kept.is_empty()).then(|| view! {
                <ul class="kept">
                    {plan.kept.iter().map(|k| view! { <li>{format!("{} stays: {}", k.service, k.why)}</li> }).collect_view()}
                </ul>
            })}
            <h3>"GPUs before and after"</h3>
            <p class="legend-row"><span class="legend before">"before"</span><span class="legend after">"after"</span></p>
            {if plan.gpus.is_empty() {
                view! { <p class="muted">"No GPU changes: nothing on this pool can be freed by moving tasks."</p> }.into_any()
            } else {
                view! { <ul class="gpus plan-gpus">{bars}</ul> }.into_any()
            }}
            <h3>"Moves"</h3>
            <table class="table moves">
                <thead><tr><th>"#"</th><th>"Task"</th><th>"Service"</th><th>"From"</th><th>"To"</th><th>"State"</th><th>"Note"</th></tr></thead>
                <tbody>
                    {plan.moves.iter().enumerate().map(|(i, m)| view! {
                        <tr class=format!("move state-{}", move_state(m.state))>
                            <td>{i + 1}</td>
                            <td><code>{m.task_id[..8.min(m.task_id.len())].to_owned()}</code></td>
                            <td><a href=format!("/services/{}", m.service)>{m.service.clone()}</a></td>
                            <td>{format!("{}/GPU {:?}", m.from_host, m.from_gpus)}</td>
                            <td>{format!("{}/GPU {:?}", m.to_host, m.to_gpus)}</td>
                            <td>{move_state(m.state)}</td>
                            <td class="reason">{m.message.clone().unwrap_or_default()}</td>
                        </tr>
                    }).collect_view()}
                </tbody>
            </table>
        </section>
    }
}

fn move_state(s: MoveState) -> &'static str {
    match s {
        MoveState::Pending => "pending",
        MoveState::Starting => "starting",
        MoveState::Done => "done",
        MoveState::Failed => "failed",
        MoveState::Undone => "undone",
    }
}

#[component]
fn PoolFitView(fit: PoolFit) -> impl IntoView {
    view! {
        <div class="pool-fit">
            <h2>{format!("Pool {} with right-sized budgets", fit.pool)}</h2>
            <p>{format!(
                "{} reserved, {} peak use. Its tasks hold {} of {} GPUs now; placed afresh with the suggested budgets they would hold {} ({} freed).",
                measured_text(fit.reserved_mib), measured_text(fit.used_mib), fit.gpus_in_use, fit.gpus_total, fit.gpus_in_use_suggested, fit.gpus_freed
            )}</p>
            <table class="table">
                <thead><tr><th>"Service"</th><th>"Verdict"</th><th>"Tasks"</th><th>"Budget"</th><th>"Suggested"</th><th>"Room for more"</th></tr></thead>
                <tbody>
                    {fit.services.iter().map(|s| view! {
                        <tr>
                            <td><a href=format!("/services/{}#fit", s.service)>{s.service.clone()}</a></td>
                            <td><crate::fit::VerdictBadge verdict=s.verdict /></td>
                            <td>{s.tasks}</td>
                            <td>{measured_text(s.budget_mib)}</td>
                            <td>{s.suggested_memory_mib.map(measured_text).unwrap_or_else(|| "—".into())}</td>
                            <td>{format!("{} more task(s)", s.extra_tasks)}</td>
                        </tr>
                    }).collect_view()}
                </tbody>
            </table>
        </div>
    }
}
