//! One task definition family: its revisions, deregistering one, and the difference
//! between any two.

use crate::access::{Declaration, guard};
use crate::components::ErrorList;
use crate::live::use_live;
use crate::pages::task_definitions::gpu_summary;
use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_params_map;
use tessera_model::service::TaskDefinition;

#[server]
pub async fn list_revisions(family: String) -> Result<Vec<TaskDefinition>, ServerFnError> {
    let control = crate::data::ssr::control()?;
    control
        .views()
        .list_task_definition_revisions(&family)
        .await
        .map_err(crate::data::ssr::failed)
}

guard!(ListRevisions, Declaration::VIEW);

#[server]
pub async fn deregister_revision(family: String, revision: u32) -> Result<(), ServerFnError> {
    let control = crate::data::ssr::control()?;
    let r = tessera_model::service::TaskDefRef { family, revision };
    control
        .deployments()
        .deregister_task_definition(&r)
        .await
        .map(|_| ())
        .map_err(crate::data::ssr::failed)
}

guard!(DeregisterRevision, Declaration::OPERATE);

/// A line of a diff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiffLine {
    Same(String),
    Removed(String),
    Added(String),
}

/// Line diff of `a` and `b` (longest common subsequence).
pub fn diff_lines(a: &str, b: &str) -> Vec<DiffLine> {
    let (a, b): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    let (n, m) = (a.len(), b.len());
    let mut lcs = vec![vec![0u32; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < n || j < m {
        if i < n && j < m && a[i] == b[j] {
            out.push(DiffLine::Same(a[i].to_owned()));
            i += 1;
            j += 1;
        } else if i < n && (j == m || lcs[i + 1][j] >= lcs[i][j + 1]) {
            out.push(DiffLine::Removed(a[i].to_owned()));
            i += 1;
        } else {
            out.push(DiffLine::Added(b[j].to_owned()));
            j += 1;
        }
    }
    out
}

#[component]
pub fn TaskDefinitionPage() -> impl IntoView {
    let params = use_params_map();
    let family = move || params.read().get("family").unwrap_or_default();
    let live = use_live();
    let deregister = Action::new(|(f, r): &(String, u32)| deregister_revision(f.clone(), *r));
    let revisions = Resource::new(
        move || (live(), family(), deregister.version().get()),
        |(_, f, _)| list_revisions(f),
    );
    view! {
        <Title text=move || format!("Task definition {}", family()) />
        <p class="crumbs"><a href="/task-definitions">"Task definitions"</a> " / " {family}</p>
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            <ErrorBoundary fallback=|errors| view! { <ErrorList errors /> }>
                {move || Suspend::new(async move { revisions.await.map(|revs| view! { <Revisions revs deregister /> }) })}
            </ErrorBoundary>
        </Transition>
    }
}

#[component]
fn Revisions(
    revs: Vec<TaskDefinition>,
    deregister: Action<(String, u32), Result<(), ServerFnError>>,
) -> impl IntoView {
    let family = revs.first().map(|d| d.family.clone()).unwrap_or_default();
    let operate = crate::access::allowed::<DeregisterRevision>();
    let latest = revs.last().map_or(1, |d| d.revision);
    let pretty: Vec<(u32, String)> = revs
        .iter()
        .map(|d| {
            (
                d.revision,
                serde_json::to_string_pretty(&d.spec).unwrap_or_default(),
            )
        })
        .collect();
    let a = RwSignal::new(latest.saturating_sub(1).max(1));
    let b = RwSignal::new(latest);
    let pretty = StoredValue::new(pretty);
    let text_of = move |r: u32| {
        pretty.with_value(|p| {
            p.iter()
                .find(|(rev, _)| *rev == r)
                .map(|(_, t)| t.clone())
                .unwrap_or_default()
        })
    };
    let options = move |sel: RwSignal<u32>| {
        pretty
            .with_value(|p| p.iter().map(|(r, _)| *r).collect::<Vec<_>>())
            .into_iter()
            .map(move |r| view! { <option value=r.to_string() selected=move || sel.get() == r>{format!("revision {r}")}</option> })
            .collect_view()
    };
    view! {
        <div class="page-head with-action">
            <h1>{family.clone()}</h1>
            <a class="button primary" href=format!("/task-definitions/new?from={family}:{latest}")>"New revision from the latest"</a>
        </div>
        <table class="table">
            <thead>
                <tr><th>"Revision"</th><th>"Registered"</th><th>"CPU"</th><th>"Memory"</th><th>"GPU"</th><th>"Status"</th><th></th></tr>
            </thead>
            <tbody>
                {revs
                    .into_iter()
                    .rev()
                    .map(|d| {
                        let (f, r) = (d.family.clone(), d.revision);
                        view! {
                            <tr data-revision=r.to_string()>
                                <td>{format!("{}:{}", d.family, d.revision)}</td>
                                <td>{d.registered_at.short()}</td>
                                <td>{d.spec.cpu().to_string()}</td>
                                <td>{d.spec.memory().to_string()}</td>
                                <td>{gpu_summary(&d.spec)}</td>
                                <td>{if d.active { "active" } else { "inactive" }}</td>
                                <td>
                                    {d.active.then(|| view! {
                                        <button class="link danger" title=move || operate.get() disabled=move || operate.get().is_some() on:click=move |_| { deregister.dispatch((f.clone(), r)); }>"Deregister"</button>
                                    })}
                                </td>
                            </tr>
                        }
                    })
                    .collect_view()}
            </tbody>
        </table>
        <section class="panel">
            <h2>"Compare revisions"</h2>
            <div class="filters">
                <label>"From" <select name="diff-a" on:change=move |ev| a.set(event_target_value(&ev).parse().unwrap_or(1))>{options(a)}</select></label>
                <label>"To" <select name="diff-b" on:change=move |ev| b.set(event_target_value(&ev).parse().unwrap_or(1))>{options(b)}</select></label>
            </div>
            <pre class="diff">
                {move || {
                    diff_lines(&text_of(a.get()), &text_of(b.get()))
                        .into_iter()
                        .map(|l| match l {
                            DiffLine::Same(t) => view! { <span class="same">{format!("  {t}\n")}</span> },
                            DiffLine::Removed(t) => view! { <span class="removed">{format!("- {t}\n")}</span> },
                            DiffLine::Added(t) => view! { <span class="added">{format!("+ {t}\n")}</span> },
                        })
                        .collect_view()
                }}
            </pre>
        </section>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diff_marks_changed_lines() {
        let d = diff_lines("a\nb\nc", "a\nx\nc\nd");
        assert_eq!(
            d,
            vec![
                DiffLine::Same("a".into()),
                DiffLine::Removed("b".into()),
                DiffLine::Added("x".into()),
                DiffLine::Same("c".into()),
                DiffLine::Added("d".into())
            ]
        );
        assert!(
            diff_lines("same", "same")
                .iter()
                .all(|l| matches!(l, DiffLine::Same(_)))
        );
    }
}
