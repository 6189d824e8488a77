//! Fit evidence on the service page: the verdict with the numbers behind it, memory and SM
//! use over time against the budget and the compute cap, each task's verdict, how widely
//! the service's tasks are spread (blast radius), and right-sizing in one step.

use crate::access::{Declaration, guard};
use crate::components::measured_text;
use leptos::prelude::*;
use tessera_model::MiB;
use tessera_model::fit::{RightSize, ServiceFit, UsagePoint, Verdict, span_words};
use tessera_model::service::Task;

#[server]
pub async fn get_service_fit(name: String, range: String) -> Result<ServiceFit, ServerFnError> {
    use crate::data::ssr::{control, failed};
    control()?
        .views()
        .service_fit(&name, &range)
        .await
        .map_err(failed)
}

guard!(GetServiceFit, Declaration::VIEW);

/// The right-size proposal, or why there is none.
#[server]
pub async fn get_right_size(name: String) -> Result<Result<RightSize, String>, ServerFnError> {
    use crate::data::ssr::{control, told};
    use tessera_control::Told;
    match control()?.views().right_size_proposal(&name).await {
        Ok(p) => Ok(Ok(p)),
        Err(e) => match e.told() {
            // Why no proposal can be made (no evidence yet): shown in the panel.
            Told::Conflict(why) => Ok(Err(why)),
            other => Err(told(other)),
        },
    }
}

guard!(GetRightSize, Declaration::VIEW);

/// Registers the proposal and rolls it out; the new revision.
#[server]
pub async fn apply_right_size(name: String) -> Result<String, ServerFnError> {
    use crate::data::ssr::{control, failed};
    let (_, def) = control()?
        .deployments()
        .right_size(&name)
        .await
        .map_err(failed)?;
    Ok(def.reference().to_string())
}

guard!(ApplyRightSize, Declaration::OPERATE);

/// A verdict as a badge.
#[component]
pub fn VerdictBadge(verdict: Verdict) -> impl IntoView {
    view! { <span class=format!("badge verdict verdict-{}", verdict.slug())>{verdict.as_str()}</span> }
}

/// One line of a chart: its name, CSS class and points (time, value).
pub struct Series {
    pub name: std::borrow::Cow<'static, str>,
    pub class: &'static str,
    pub points: Vec<(i64, f64)>,
}

const W: f64 = 640.0;
const H: f64 = 170.0;
const PAD_L: f64 = 58.0;
const PAD_B: f64 = 22.0;

/// A line chart in SVG: `series` over time, with horizontal `marks` (a budget, a cap).
#[component]
pub(crate) fn Chart(
    title: String,
    unit: &'static str,
    series: Vec<Series>,
    marks: Vec<(String, &'static str, f64)>,
    from: i64,
    to: i64,
) -> impl IntoView {
    let top = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .chain(marks.iter().map(|m| m.2))
        .fold(1.0f64, f64::max)
        * 1.1;
    let span = (to - from).max(1) as f64;
    let x = move |t: i64| PAD_L + (W - PAD_L - 8.0) * ((t - from) as f64 / span).clamp(0.0, 1.0);
    let y = move |v: f64| 8.0 + (H - PAD_B - 8.0) * (1.0 - v / top);
    let lines = series
        .iter()
        .map(|s| {
            let d = s
                .points
                .iter()
                .enumerate()
                .map(|(i, &(t, v))| {
                    format!("{}{:.1},{:.1}", if i == 0 { "M" } else { "L" }, x(t), y(v))
                })
                .collect::<String>();
            let dots = (s.points.len() == 1).then(|| {
                let (t, v) = s.points[0];
                view! { <circle class=s.class cx=format!("{:.1}", x(t)) cy=format!("{:.1}", y(v)) r="3" /> }
            });
            view! { <path class=format!("line {}", s.class) d=d /> {dots} }
        })
        .collect_view();
    let mark_lines = marks
        .iter()
        .map(|(label, class, v)| {
            let yy = format!("{:.1}", y(*v));
            view! {
                <line class=format!("mark {class}") x1=format!("{PAD_L}") x2=format!("{}", W - 8.0) y1=yy.clone() y2=yy.clone() />
                <text class=format!("mark-label {class}") x=format!("{}", W - 10.0) y=format!("{:.1}", y(*v) - 4.0) text-anchor="end">{label.clone()}</text>
            }
        })
        .collect_view();
    let axis = [0.0, 0.5, 1.0]
        .map(|f| {
            let v = top / 1.1 * f;
            let label = match unit {
                "MiB" => measured_text(MiB(v.round() as u64)),
                "%" => format!("{v:.0} %"),
                other => format!("{} {other}", tessera_model::work::trim_float((v * 10.0).round() / 10.0)),
            };
            view! { <text class="axis" x=format!("{}", PAD_L - 6.0) y=format!("{:.1}", y(v) + 4.0) text-anchor="end">{label}</text> }
        })
        .collect_view();
    let x_labels = view! {
        <text class="axis" x=format!("{PAD_L}") y=format!("{}", H - 6.0) text-anchor="start">{format!("−{}", span_words((to - from).max(0) as u64))}</text>
        <text class="axis" x=format!("{}", W - 8.0) y=format!("{}", H - 6.0) text-anchor="end">"now"</text>
    };
    let legend = series
        .iter()
        .map(|s| view! { <span class=format!("legend {}", s.class)>{s.name.clone()}</span> })
        .collect_view();
    let empty = series.iter().all(|s| s.points.is_empty());
    view! {
        <figure class="chart">
            <figcaption>{title} " " {legend}</figcaption>
            <svg viewBox=format!("0 0 {W} {H}") role="img" aria-label="usage over time">
                <line class="axis-line" x1=format!("{PAD_L}") x2=format!("{PAD_L}") y1="8" y2=format!("{}", H - PAD_B) />
                <line class="axis-line" x1=format!("{PAD_L}") x2=format!("{}", W - 8.0) y1=format!("{}", H - PAD_B) y2=format!("{}", H - PAD_B) />
                {axis}
                {x_labels}
                {mark_lines}
                {lines}
                {empty.then(|| view! { <text class="axis" x=format!("{}", W / 2.0) y=format!("{}", H / 2.0) text-anchor="middle">"no measurements in this range yet"</text> })}
            </svg>
        </figure>
    }
}

fn series(history: &[UsagePoint], f: impl Fn(&UsagePoint) -> Option<f64>) -> Vec<(i64, f64)> {
    history
        .iter()
        .filter_map(|p| f(p).map(|v| (p.t, v)))
        .collect()
}

/// How the service's tasks spread over GPUs and hosts, and what one GPU's fault would take.
#[component]
pub fn BlastRadius(
    tasks: Vec<Task>,
    constraints: tessera_model::service::ServiceConstraints,
) -> impl IntoView {
    let live: Vec<&Task> = tasks
        .iter()
        .filter(|t| t.state.holds_capacity() && t.host.is_some())
        .collect();
    let mut per_gpu: std::collections::BTreeMap<String, u32> = Default::default();
    let mut hosts: std::collections::BTreeSet<String> = Default::default();
    for t in &live {
        if let Some(h) = &t.host {
            hosts.insert(h.to_string());
        }
        for a in &t.allocations {
            *per_gpu.entry(a.gpu.to_string()).or_default() += 1;
        }
    }
    let total = live.len() as u32;
    let worst = per_gpu.values().copied().max().unwrap_or(0);
    let warn = total > 1 && worst * 2 > total;
    let caps = [
        constraints
            .max_per_gpu
            .map(|n| format!("at most {n} per GPU")),
        constraints
            .host_cap()
            .map(|n| format!("at most {n} per host")),
    ]
    .into_iter()
    .flatten()
    .collect::<Vec<_>>();
    let text = format!(
        "{total} task(s) on {} GPU(s) across {} host(s); one GPU's fault would stop up to {worst} of them{}",
        per_gpu.len(),
        hosts.len(),
        if caps.is_empty() {
            String::new()
        } else {
            format!(" (capped: {})", caps.join(", "))
        }
    );
    view! {
        <p class=if warn { "blast warn" } else { "blast" } data-blast-warn=warn.to_string()>
            {text}
            {warn.then(|| view! { <strong>" — more than half of the service shares one MPS server; spread it with a per-GPU cap"</strong> })}
        </p>
    }
}

/// The fit panel of a service page.
#[component]
pub fn FitPanel(name: Signal<String>, live: Signal<u64>) -> impl IntoView {
    let range = RwSignal::new("hour".to_owned());
    // Measured use changes without events: in the browser, read it again every 10 s.
    let refresh = RwSignal::new(0u64);
    Effect::new(move |_| {
        if let Ok(handle) = set_interval_with_handle(
            move || refresh.update(|n| *n += 1),
            std::time::Duration::from_secs(10),
        ) {
            on_cleanup(move || handle.clear());
        }
    });
    let fit = Resource::new(
        move || (live.get(), refresh.get(), name.get(), range.get()),
        |(_, _, n, r)| get_service_fit(n, r),
    );
    let show_resize = RwSignal::new(false);
    let applied = Action::new(|n: &String| apply_right_size(n.clone()));
    let proposal = Resource::new(
        move || (show_resize.get(), name.get(), applied.version().get()),
        |(show, n, _)| async move {
            if show {
                Some(get_right_size(n).await)
            } else {
                None
            }
        },
    );
    let operate = crate::access::allowed::<ApplyRightSize>();
    let range_button = move |r: &'static str, label: &'static str| {
        view! {
            <button
                type="button"
                class=move || if range.get() == r { "range on" } else { "range" }
                aria-pressed=move || (range.get() == r).to_string()
                on:click=move |_| range.set(r.to_owned())
            >{label}</button>
        }
    };
    view! {
        <section class="panel fit" id="fit">
            <div class="fit-head">
                <h2>"Fit of measured use"</h2>
                <div class="ranges" role="group" aria-label="Range">
                    {range_button("hour", "Last hour")}
                    {range_button("day", "Day")}
                    {range_button("month", "Month")}
                </div>
            </div>
            <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
                {move || Suspend::new(async move {
                    match fit.await {
                        Err(e) => view! { <p class="field-error">{e.to_string()}</p> }.into_any(),
                        Ok(f) => view! { <FitBody fit=f /> }.into_any(),
                    }
                })}
            </Transition>
            <div class="resize">
                <button type="button" on:click=move |_| show_resize.update(|s| *s = !*s)>
                    {move || if show_resize.get() { "Hide right-size" } else { "Right-size…" }}
                </button>
                {move || applied.value().get().map(|r| match r {
                    Ok(rev) => view! { <p class="notice" role="status">{format!("Registered {rev}; rolling out through the service's deployment.")}</p> }.into_any(),
                    Err(e) => view! { <p class="field-error" role="alert">{e.to_string()}</p> }.into_any(),
                })}
                <Transition fallback=|| ()>
                    {
                        move || {
                            Suspend::new(async move {
                                match proposal.await {
                                    None => ().into_any(),
                                    Some(Err(e)) => view! { <p class="field-error">{e.to_string()}</p> }.into_any(),
                                    Some(Ok(Err(why))) => view! { <p class="muted" data-right-size="none">{why}</p> }.into_any(),
                                    Some(Ok(Ok(p))) => {
                                        let n = name.get_untracked();
                                        view! {
                                            <div class="resize-diff" data-right-size="proposal">
                                                <p>{format!("A new revision of {} with the suggested budget ({}: {}):", p.current, p.verdict, p.reason)}</p>
                                                <table class="table">
                                                    <thead><tr><th>"Field"</th><th>{p.current.clone()}</th><th>"New revision"</th></tr></thead>
                                                    <tbody>
                                                        {p.changes.iter().map(|c| view! {
                                                            <tr><td><code>{c.field.clone()}</code></td><td class="from">{c.from.clone()}</td><td class="to">{c.to.clone()}</td></tr>
                                                        }).collect_view()}
                                                    </tbody>
                                                </table>
                                                <button class="primary" title=move || operate.get() disabled=move || operate.get().is_some()
                                                    on:click=move |_| { applied.dispatch(n.clone()); }>"Register and roll out"</button>
                                            </div>
                                        }.into_any()
                                    }
                                }
                            })
                        }
                    }
                </Transition>
            </div>
        </section>
    }
}

#[component]
fn FitBody(fit: ServiceFit) -> impl IntoView {
    let j = fit.judgement.clone();
    let now = fit
        .history
        .last()
        .map_or(0, |p| p.t + fit.bucket_secs as i64);
    let span = match fit.range.as_str() {
        "day" => 86_400,
        "month" => 30 * 86_400,
        _ => 3600,
    };
    // The range asked for, or less while the evidence is younger than it (the chart then
    // spans what there is, from its first bucket).
    let first = fit.history.first().map_or(now, |p| p.t);
    let from = (now - span).max(first - fit.bucket_secs as i64);
    let budget = fit.budget_mib.0 as f64;
    let mut mem_marks = vec![(
        format!("budget {}", measured_text(fit.budget_mib)),
        "budget",
        budget,
    )];
    if let Some(s) = j.suggested_memory_mib.filter(|_| fit.shared) {
        mem_marks.push((
            format!("suggested {}", measured_text(s)),
            "suggested",
            s.0 as f64,
        ));
    }
    let mut sm_marks = Vec::new();
    if let Some(c) = fit.compute_cap_percent {
        sm_marks.push((format!("cap {c} %"), "budget", f64::from(c)));
    }
    let suggestion = match (fit.shared, j.suggested_memory_mib) {
        (true, Some(m)) => format!(
            "Suggested budget: {} GPU memory{}",
            measured_text(m),
            j.suggested_compute_percent
                .filter(|_| fit.compute_cap_percent.is_some())
                .map(|c| format!(", compute cap {c} %"))
                .unwrap_or_default()
        ),
        (false, _) => "Whole-GPU tasks: no MPS budget to right-size.".to_owned(),
        (true, None) => "No suggestion until use is measured.".to_owned(),
    };
    let counts = fit
        .by_verdict
        .iter()
        .map(|c| view! { <li><VerdictBadge verdict=c.verdict /> {format!(" {} task(s)", c.tasks)}</li> })
        .collect_view();
    let tasks = fit
        .tasks
        .iter()
        .map(|t| {
            view! {
                <tr data-task=t.task_id.clone()>
                    <td><code>{t.task_id[..8.min(t.task_id.len())].to_owned()}</code></td>
                    <td>{t.host.clone().unwrap_or_default()}</td>
                    <td><VerdictBadge verdict=t.judgement.verdict /></td>
                    <td>{t.peak_mib.map(measured_text).unwrap_or_else(|| "—".into())}</td>
                    <td>{measured_text(t.budget_mib)}</td>
                    <td>{t.sm_p95.map(|s| format!("{s} %")).unwrap_or_else(|| "—".into())}</td>
                    <td>{span_words(t.evidence_secs)}</td>
                    <td class="reason">{t.judgement.reason.clone()}</td>
                </tr>
            }
        })
        .collect_view();
    let mem = vec![
        Series {
            name: "max across tasks".into(),
            class: "s-max",
            points: series(&fit.history, |p| Some(p.memory_max_mib as f64)),
        },
        Series {
            name: "mean task".into(),
            class: "s-p50",
            points: series(&fit.history, |p| Some(p.memory_mean_mib as f64)),
        },
    ];
    let sm = vec![
        Series {
            name: "p95".into(),
            class: "s-max",
            points: series(&fit.history, |p| p.sm_p95.map(f64::from)),
        },
        Series {
            name: "mean of medians".into(),
            class: "s-p50",
            points: series(&fit.history, |p| p.sm_mean.map(f64::from)),
        },
    ];
    let bucket = span_words(fit.bucket_secs);
    view! {
        <div class="fit-summary" data-verdict=j.verdict.slug()>
            <p class="verdict-line"><VerdictBadge verdict=j.verdict /> " " {j.reason.clone()}</p>
            <p class="suggestion">{suggestion}</p>
            <p class="muted">{format!("{} reserved, {} peak use across its tasks · points are {bucket} buckets", measured_text(fit.reserved_mib), measured_text(fit.used_mib))}</p>
            {fit.time_note.clone().map(|n| view! { <p class="notice">{n}</p> })}
            <ul class="verdict-counts">{counts}</ul>
        </div>
        <div class="charts">
            <Chart title="GPU memory".into() unit="MiB" series=mem marks=mem_marks from=from to=now />
            <Chart title="SM use".into() unit="%" series=sm marks=sm_marks from=from to=now />
        </div>
        <table class="table fit-tasks">
            <thead><tr><th>"Task"</th><th>"Host"</th><th>"Verdict"</th><th>"Peak"</th><th>"Budget"</th><th>"SM p95"</th><th>"Evidence"</th><th>"Why"</th></tr></thead>
            <tbody>{tasks}</tbody>
        </table>
    }
}
