//! The HTML shell, the router and the navigation shared by every page.

use crate::access::{Declaration, SignedIn, guard};
use crate::live::provide_live;
use crate::pages::audit::AuditPage;
use crate::pages::consolidation::ConsolidationPage;
use crate::pages::host::HostPage;
use crate::pages::hosts::HostsPage;
use crate::pages::notifications::NotificationsPage;
use crate::pages::overview::OverviewPage;
use crate::pages::projects::ProjectsPage;
use crate::pages::service::ServicePage;
use crate::pages::service_new::ServiceWizardPage;
use crate::pages::services::ServicesPage;
use crate::pages::sign_in::SignInPage;
use crate::pages::task::TaskPage;
use crate::pages::task_definition::TaskDefinitionPage;
use crate::pages::task_definitions::{TaskDefinitionEditorPage, TaskDefinitionsPage};
use crate::pages::users::UsersPage;
use leptos::prelude::*;
use leptos_meta::{Link, MetaTags, Stylesheet, Title, provide_meta_context};
use leptos_router::components::{A, Route, Router, Routes};
use leptos_router::{Lazy, LazyRoute, lazy_route, path};
use tessera_model::auth::{Caller, Role};

/// Who is signed in (the authentication layer put the caller on the request), or `None`.
#[server]
pub async fn current_caller() -> Result<Option<Caller>, ServerFnError> {
    Ok(crate::data::ssr::caller())
}

guard!(CurrentCaller, Declaration::PUBLIC);

/// The servers sharing the database and which one schedules, for the footer.
#[server]
pub async fn cluster_status() -> Result<crate::data::ClusterView, ServerFnError> {
    let control = crate::data::ssr::control()?;
    control.cluster().await.map_err(crate::data::ssr::failed)
}

guard!(ClusterStatus, Declaration::VIEW);

/// Each page's code loads on its own when the WASM bundle is split
/// (`cargo leptos build --release --split`), so a first load carries one page.
macro_rules! lazy_page {
    ($route:ident, $page:ident) => {
        #[derive(Debug)]
        struct $route;

        #[lazy_route]
        impl LazyRoute for $route {
            fn data() -> Self {
                $route
            }

            fn view(_this: Self) -> AnyView {
                view! {
                    <PageReady />
                    <$page />
                }
                .into_any()
            }
        }
    };
}

lazy_page!(OverviewRoute, OverviewPage);
lazy_page!(HostsRoute, HostsPage);
lazy_page!(HostRoute, HostPage);
lazy_page!(ServicesRoute, ServicesPage);
lazy_page!(ServiceWizardRoute, ServiceWizardPage);
lazy_page!(ServiceRoute, ServicePage);
lazy_page!(TaskDefinitionsRoute, TaskDefinitionsPage);
lazy_page!(TaskDefinitionEditorRoute, TaskDefinitionEditorPage);
lazy_page!(TaskDefinitionRoute, TaskDefinitionPage);
lazy_page!(SignInRoute, SignInPage);
lazy_page!(AuditRoute, AuditPage);
lazy_page!(ConsolidationRoute, ConsolidationPage);
lazy_page!(ProjectsRoute, ProjectsPage);
lazy_page!(TaskRoute, TaskPage);
lazy_page!(NotificationsRoute, NotificationsPage);
lazy_page!(UsersRoute, UsersPage);

/// The document around the app, rendered on the server only.
pub fn shell(options: LeptosOptions) -> impl IntoView {
    view! {
        <!DOCTYPE html>
        <html lang="en">
            <head>
                <meta charset="utf-8" />
                <meta name="viewport" content="width=device-width, initial-scale=1" />
                <AutoReload options=options.clone() />
                <HydrationScripts options />
                <MetaTags />
            </head>
            <body>
                <App />
            </body>
        </html>
    }
}

/// The console: navigation and one route per page.
#[component]
pub fn App() -> impl IntoView {
    provide_meta_context();
    // Flipped by the page once its (lazily loaded) code has hydrated; browser tests wait
    // for it before they type or click.
    let (hydrated, set_hydrated) = signal(false);
    provide_context(PageHydrated(set_hydrated));
    let signed_in = SignedIn(Resource::new_blocking(|| (), |_| current_caller()));
    provide_context(signed_in);
    provide_live(signed_in);
    view! {
        <Stylesheet id="leptos" href="/pkg/tessera.css" />
        <Link rel="icon" href="/favicon.ico" />
        <Title formatter=|page: String| format!("{page} · Tessera") />
        <Router>
            <header class="topbar">
                <a class="brand" href="/">
                    <span class="brand-mark" aria-hidden="true"></span>
                    "Tessera"
                </a>
                <Transition fallback=|| ()>
                    {move || Suspend::new(async move {
                        let caller = signed_in.0.await.ok().flatten();
                        caller.map(|c| view! { <MainNav caller=c /> })
                    })}
                </Transition>
            </header>
            <main id="main" data-hydrated=move || hydrated.get().then_some("true")>
                <Routes fallback=|| view! { <NotFound /> }>
                    <Route path=path!("/") view={ Lazy::<OverviewRoute>::new() } />
                    <Route path=path!("/hosts") view={ Lazy::<HostsRoute>::new() } />
                    <Route path=path!("/hosts/:id") view={ Lazy::<HostRoute>::new() } />
                    <Route path=path!("/services") view={ Lazy::<ServicesRoute>::new() } />
                    <Route path=path!("/services/new") view={ Lazy::<ServiceWizardRoute>::new() } />
                    <Route path=path!("/services/:name") view={ Lazy::<ServiceRoute>::new() } />
                    <Route path=path!("/tasks/:id") view={ Lazy::<TaskRoute>::new() } />
                    <Route path=path!("/task-definitions") view={ Lazy::<TaskDefinitionsRoute>::new() } />
                    <Route path=path!("/task-definitions/new") view={ Lazy::<TaskDefinitionEditorRoute>::new() } />
                    <Route path=path!("/task-definitions/:family") view={ Lazy::<TaskDefinitionRoute>::new() } />
                    <Route path=path!("/sign-in") view={ Lazy::<SignInRoute>::new() } />
                    <Route path=path!("/users") view={ Lazy::<UsersRoute>::new() } />
                    <Route path=path!("/notifications") view={ Lazy::<NotificationsRoute>::new() } />
                    <Route path=path!("/audit") view={ Lazy::<AuditRoute>::new() } />
                    <Route path=path!("/consolidation") view={ Lazy::<ConsolidationRoute>::new() } />
                    <Route path=path!("/projects") view={ Lazy::<ProjectsRoute>::new() } />
                </Routes>
            </main>
            <Transition fallback=|| ()>
                {move || Suspend::new(async move {
                    let caller = signed_in.0.await.ok().flatten();
                    caller.map(|_| view! { <ClusterFooter /> })
                })}
            </Transition>
        </Router>
    }
}

/// The pages, and who is signed in with a way to sign out.
#[component]
fn MainNav(caller: Caller) -> impl IntoView {
    let admin = caller.role.allows(Role::Admin);
    view! {
        <nav aria-label="Main">
            <A href="/" exact=true>"Overview"</A>
            <A href="/hosts">"Hosts"</A>
            <A href="/services">"Services"</A>
            <A href="/task-definitions">"Task definitions"</A>
            <A href="/consolidation">"Consolidation"</A>
            <A href="/projects">"Projects"</A>
            {admin.then(|| view! { <A href="/users">"Users"</A> })}
            {admin.then(|| view! { <A href="/notifications">"Notifications"</A> })}
            {admin.then(|| view! { <A href="/audit">"Audit log"</A> })}
        </nav>
        <form
            class="whoami"
            method="post"
            action="/api/v1/session/end"
            on:submit=|_| crate::live::stop()
        >
            <span class="user" title="Signed in">{caller.name.clone()}</span>
            <span class=format!("badge role-{}", caller.role)>{caller.role.as_str()}</span>
            <button type="submit" class="link">"Sign out"</button>
        </form>
    }
}

/// The footer of a signed-in page: this server's version, how many servers share the
/// database (their versions when they differ, as in a rolling upgrade), and which one
/// schedules since when (refreshed with the live view).
#[component]
fn ClusterFooter() -> impl IntoView {
    let live = crate::live::use_live();
    let cluster = Resource::new(live, |_| cluster_status());
    view! {
        <footer class="cluster" aria-label="Servers">
            <Transition fallback=|| ()>
                {move || Suspend::new(async move {
                    cluster.await.ok().map(|c| view! { <ClusterLine c /> })
                })}
            </Transition>
        </footer>
    }
}

#[component]
fn ClusterLine(c: crate::data::ClusterView) -> impl IntoView {
    let count = c.servers.len();
    let servers = if count == 1 {
        "1 server".to_owned()
    } else {
        format!("{count} servers")
    };
    let mut versions: Vec<String> = c
        .servers
        .iter()
        .map(|s| s.version.clone().unwrap_or_else(|| "before 0.2".into()))
        .collect();
    versions.sort();
    versions.dedup();
    let mixed = (versions.len() > 1).then(|| {
        let each: Vec<String> = c
            .servers
            .iter()
            .map(|s| {
                let v = s.version.as_deref().unwrap_or("before 0.2");
                format!("{} {v}", s.id)
            })
            .collect();
        format!("mixed versions: {}", each.join(", "))
    });
    let build = format!("build {}", c.answered_by.build);
    let version = format!("Tessera {}", c.answered_by.version);
    let scheduler = c.servers.into_iter().find(|s| s.scheduling);
    let scheduling = match scheduler {
        Some(s) => {
            let since = s.since.map(|t| t.short()).unwrap_or_default();
            // An id already names its address (machine/host:port); else show both.
            let address = s.address.split("://").last().unwrap_or(&s.address);
            if s.id.ends_with(address) {
                format!("scheduling: {} since {since} UTC", s.id)
            } else {
                format!("scheduling: {} ({}) since {since} UTC", s.id, s.address)
            }
        }
        None => "no server schedules right now".to_owned(),
    };
    view! {
        <span class="version" title=build>{version}</span>
        <span class="sep" aria-hidden="true">"·"</span>
        <span>{servers}</span>
        {mixed
            .map(|m| {
                view! {
                    <span class="sep" aria-hidden="true">"·"</span>
                    <span class="mixed">{m}</span>
                }
            })}
        <span class="sep" aria-hidden="true">"·"</span>
        <span>{scheduling}</span>
    }
}

/// Tells the shell that the current page is hydrated.
#[derive(Clone, Copy)]
struct PageHydrated(WriteSignal<bool>);

/// Rendered first by every page: its effect runs (in the browser only) once the page's
/// own code has loaded and hydrated.
#[component]
fn PageReady() -> impl IntoView {
    let ready = use_context::<PageHydrated>();
    Effect::new(move |_| {
        if let Some(PageHydrated(set)) = ready {
            set.set(true);
        }
    });
}

#[component]
fn NotFound() -> impl IntoView {
    #[cfg(feature = "ssr")]
    if let Some(response) = use_context::<leptos_axum::ResponseOptions>() {
        response.set_status(http::StatusCode::NOT_FOUND);
    }
    view! {
        <PageReady />
        <Title text="Not found" />
        <h1>"Page not found"</h1>
        <p>
            "There is no page here. " <a href="/hosts">"Go to the hosts"</a> "."
        </p>
    }
}
