//! Projects administered in the browser (admins, on the Projects page): add a project,
//! set or clear its quota in a pool (guaranteed and limit, in GPUs and GPU memory), give a
//! user a role in it or take it away. The same validation and messages as `POST`/`PUT
//! /api/v1/projects` and `PUT`/`DELETE /api/v1/projects/{name}/members/{username}`.

use crate::access::{Declaration, guard};
use crate::components::FieldErrors;
use leptos::prelude::*;
use tessera_model::auth::Role;
use tessera_model::project::{Amounts, ProjectInput, ProjectSettings, Quota};
use tessera_model::taskdef::FieldError;

/// Refused input comes back as field errors, anything else as the error.
type Answer = Result<Result<(), Vec<FieldError>>, ServerFnError>;

#[cfg(feature = "ssr")]
fn answer(r: Result<(), tessera_control::ControlError>) -> Answer {
    match r {
        Ok(()) => Ok(Ok(())),
        Err(e) => crate::data::ssr::refused(e).map(Err),
    }
}

/// The projects and the pools to choose from.
#[server]
pub async fn project_choices() -> Result<(Vec<String>, Vec<String>), ServerFnError> {
    use crate::data::ssr::{control_for, failed};
    let control = control_for::<ProjectChoices>()?;
    let projects = control.projects().list_projects().await.map_err(failed)?;
    let pools = control.views().list_pools().await.map_err(failed)?;
    Ok((
        projects.into_iter().map(|p| p.project.name).collect(),
        pools.into_iter().map(|p| p.name.to_string()).collect(),
    ))
}

guard!(ProjectChoices, Declaration::ADMIN);

#[server]
pub async fn add_project(name: String, weight: Option<u32>) -> Answer {
    let control = crate::data::ssr::control_for::<AddProject>()?;
    let input = ProjectInput {
        name,
        weight,
        quotas: Vec::new(),
    };
    answer(control.projects().create_project(&input).await.map(|_| ()))
}

guard!(AddProject, Declaration::ADMIN);

/// Sets `project`'s quota in `quota.pool`, keeping its other pools' (a quota with neither
/// a guarantee nor a limit clears the pool's).
#[server]
pub async fn set_quota(project: String, quota: Quota) -> Answer {
    let control = crate::data::ssr::control_for::<SetQuota>()?;
    let p = control
        .projects()
        .get_project(&project)
        .await
        .map_err(crate::data::ssr::failed)?
        .project;
    let mut quotas: Vec<Quota> = p
        .quotas
        .into_iter()
        .filter(|q| q.pool != quota.pool)
        .collect();
    if quota.guaranteed != Amounts::default() || quota.limit != Amounts::default() {
        quotas.push(quota);
    }
    let settings = ProjectSettings {
        weight: Some(p.weight),
        quotas,
    };
    answer(
        control
            .projects()
            .replace_project(&project, &settings)
            .await
            .map(|_| ()),
    )
}

guard!(SetQuota, Declaration::ADMIN);

/// Gives `username` `role` in `project`, or (`role` absent) takes the user's role there away.
#[server]
pub async fn set_member(project: String, username: String, role: Option<Role>) -> Answer {
    let control = crate::data::ssr::control_for::<SetMember>()?;
    answer(match role {
        Some(r) => {
            control
                .projects()
                .set_project_member(&project, &username, r)
                .await
        }
        None => {
            control
                .projects()
                .remove_project_member(&project, &username)
                .await
        }
    })
}

guard!(SetMember, Declaration::ADMIN);

/// A whole number from a field (empty: none), or the message naming what was typed.
fn whole(s: &str) -> Result<Option<u64>, String> {
    match s.trim() {
        "" => Ok(None),
        t => t
            .parse::<u64>()
            .map(Some)
            .map_err(|_| format!("must be a whole number (or empty), got {t:?}")),
    }
}

/// The panel, for admins only (others see nothing of it).
#[component]
pub fn ProjectAdmin() -> impl IntoView {
    let admin = crate::access::allowed::<ProjectChoices>();
    let changes = RwSignal::new(0u32);
    let choices = Resource::new(move || changes.get(), |_| project_choices());
    // What the last change did: kept here, since a change reloads the choices, which
    // makes the forms anew.
    let said = RwSignal::new(None::<&'static str>);
    let changed = Callback::new(move |what: &'static str| {
        said.set(Some(what));
        changes.update(|n| *n += 1);
    });
    move || {
        admin.get().is_none().then(|| {
            view! {
                <Transition fallback=|| ()>
                    {move || Suspend::new(async move {
                        choices.await.ok().map(|(projects, pools)| view! { <ProjectForms projects pools changed said /> })
                    })}
                </Transition>
                {move || said.get().map(|s| view! { <p class="notice" role="status">{s}</p> })}
            }
        })
    }
}

#[component]
fn ProjectForms(
    projects: Vec<String>,
    pools: Vec<String>,
    changed: Callback<&'static str>,
    said: RwSignal<Option<&'static str>>,
) -> impl IntoView {
    let add = Action::new(|(n, w): &(String, Option<u32>)| add_project(n.clone(), *w));
    let quota = Action::new(|(p, q): &(String, Quota)| set_quota(p.clone(), q.clone()));
    let member = Action::new(|(p, u, r): &(String, String, Option<Role>)| {
        set_member(p.clone(), u.clone(), *r)
    });
    for (a, what) in [
        (add.value(), "Project added."),
        (quota.value(), "Quota set."),
        (member.value(), "Role set."),
    ] {
        Effect::new(move |_| match a.get() {
            Some(Ok(Ok(()))) => changed.run(what),
            Some(_) => said.set(None),
            None => {}
        });
    }
    let local = RwSignal::new(Vec::<FieldError>::new());
    let errors_of = move |v: Option<Answer>| match v {
        Some(Ok(Err(e))) => e,
        _ => Vec::new(),
    };
    let add_errors = Signal::derive(move || errors_of(add.value().get()));
    let quota_errors = Signal::derive(move || {
        let mut e = errors_of(quota.value().get());
        e.extend(local.get());
        e
    });
    let member_errors = Signal::derive(move || errors_of(member.value().get()));
    let (name, weight) = (RwSignal::new(String::new()), RwSignal::new("1".to_owned()));
    let first = projects.first().cloned().unwrap_or_default();
    let (q_project, q_pool) = (
        RwSignal::new(first.clone()),
        RwSignal::new(pools.first().cloned().unwrap_or_default()),
    );
    let fields: [RwSignal<String>; 4] = std::array::from_fn(|_| RwSignal::new(String::new()));
    let (m_project, m_user, m_role) = (
        RwSignal::new(first),
        RwSignal::new(String::new()),
        RwSignal::new("operator".to_owned()),
    );
    let select = move |label: &'static str,
                       name: &'static str,
                       options: Vec<String>,
                       to: RwSignal<String>| {
        view! {
            <label>{label} " "
                <select name=name on:change=move |ev| to.set(event_target_value(&ev))>
                    {options.into_iter().map(|o| view! { <option value=o.clone() selected=move || to.get() == o>{o.clone()}</option> }).collect_view()}
                </select>
            </label>
        }
    };
    let quota_submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        let names = [
            "guaranteed.gpus",
            "guaranteed.gpu_memory_mib",
            "limit.gpus",
            "limit.gpu_memory_mib",
        ];
        let mut parsed = [None; 4];
        let mut bad = Vec::new();
        for (i, f) in fields.iter().enumerate() {
            match whole(&f.get_untracked()) {
                Ok(v) => parsed[i] = v,
                Err(m) => bad.push(FieldError {
                    field: format!("quotas.0.{}", names[i]),
                    message: m,
                }),
            }
        }
        local.set(bad.clone());
        if !bad.is_empty() {
            return;
        }
        let gib = |v: Option<u64>| v.map(|g| g.saturating_mul(1024));
        quota.dispatch((
            q_project.get_untracked(),
            Quota {
                pool: q_pool.get_untracked(),
                guaranteed: Amounts {
                    gpus: parsed[0],
                    gpu_memory_mib: gib(parsed[1]),
                    ..Default::default()
                },
                limit: Amounts {
                    gpus: parsed[2],
                    gpu_memory_mib: gib(parsed[3]),
                    ..Default::default()
                },
            },
        ));
    };
    let number = move |label: &'static str, field: &'static str, s: RwSignal<String>| {
        view! {
            <label>{label} " "
                <input type="text" inputmode="numeric" size="6" name=field prop:value=s on:input=move |ev| s.set(event_target_value(&ev)) />
                <FieldErrors errors=quota_errors field=format!("quotas.0.{field}") />
            </label>
        }
    };
    let done = |v: Option<Answer>| match v {
        Some(Ok(Err(e))) => crate::components::request_refusal(e),
        Some(Err(e)) => {
            Some(view! { <p class="field-error" role="alert">{e.to_string()}</p> }.into_any())
        }
        _ => None,
    };
    view! {
        <section class="panel project-admin" aria-label="Administer projects">
            <h2>"Administer projects"</h2>
            <h3>"Add a project"</h3>
            <form class="controls" aria-label="New project" on:submit=move |ev| {
                ev.prevent_default();
                let w = weight.get_untracked().trim().parse::<u32>().ok();
                add.dispatch((name.get_untracked(), w));
            }>
                <label>"Name " <input type="text" name="project-name" prop:value=name on:input=move |ev| name.set(event_target_value(&ev)) />
                    <FieldErrors errors=add_errors field="name".to_owned() /></label>
                <label>"Weight " <input type="text" inputmode="numeric" size="4" name="weight" prop:value=weight on:input=move |ev| weight.set(event_target_value(&ev)) />
                    <small class="muted">"its share of borrowed capacity, 1 to 1000"</small>
                    <FieldErrors errors=add_errors field="weight".to_owned() /></label>
                <button type="submit" class="primary">"Add project"</button>
            </form>
            {move || done(add.value().get())}
            <h3>"A project's quota in a pool"</h3>
            <form class="controls" aria-label="Quota" on:submit=quota_submit>
                {select("Project", "quota-project", projects.clone(), q_project)}
                {select("Pool", "quota-pool", pools.clone(), q_pool)}
                {number("Guaranteed GPUs", "guaranteed.gpus", fields[0])}
                {number("Guaranteed GPU memory (GiB)", "guaranteed.gpu_memory_mib", fields[1])}
                {number("Limit GPUs", "limit.gpus", fields[2])}
                {number("Limit GPU memory (GiB)", "limit.gpu_memory_mib", fields[3])}
                <button type="submit" class="primary">"Set quota"</button>
                <small class="muted">"all empty: the pool's quota is cleared"</small>
            </form>
            {move || {
                // The server's word on the quota as a whole (a limit below its guarantee,
                // a pool that is gone): what no field above shows.
                let shown = ["guaranteed.gpus", "guaranteed.gpu_memory_mib", "limit.gpus", "limit.gpu_memory_mib"];
                let rest: Vec<String> = quota_errors
                    .get()
                    .into_iter()
                    .filter(|e| !shown.iter().any(|f| e.field == format!("quotas.0.{f}")))
                    .map(|e| format!("{}: {}", e.field, e.message))
                    .collect();
                (!rest.is_empty()).then(|| view! { <p class="field-error" role="alert">{rest.join("; ")}</p> })
            }}
            {move || done(quota.value().get())}
            <h3>"A user's role in a project"</h3>
            <form class="controls" aria-label="Member" on:submit=move |ev| {
                ev.prevent_default();
                let role = m_role.get_untracked().parse::<Role>().ok();
                member.dispatch((m_project.get_untracked(), m_user.get_untracked(), role));
            }>
                {select("Project", "member-project", projects.clone(), m_project)}
                <label>"User " <input type="text" name="member-user" prop:value=m_user on:input=move |ev| m_user.set(event_target_value(&ev)) />
                    <FieldErrors errors=member_errors field="username".to_owned() /></label>
                {select("Role", "member-role", vec!["operator".into(), "viewer".into(), "none".into()], m_role)}
                <button type="submit" class="primary">"Set role"</button>
                <small class="muted">"none: takes the user's role in the project away"</small>
            </form>
            {move || done(member.value().get())}
        </section>
    }
}
