//! The HTML shell, the router and the navigation shared by every page.

use crate::live::provide_live;
use crate::pages::host::HostPage;
use crate::pages::hosts::HostsPage;
use crate::pages::overview::OverviewPage;
use crate::pages::service::ServicePage;
use crate::pages::service_new::ServiceWizardPage;
use crate::pages::services::ServicesPage;
use crate::pages::task_definition::TaskDefinitionPage;
use crate::pages::task_definitions::{TaskDefinitionEditorPage, TaskDefinitionsPage};
use leptos::prelude::*;
use leptos_meta::{Link, MetaTags, Stylesheet, Title, provide_meta_context};
use leptos_router::components::{A, Route, Router, Routes};
use leptos_router::path;

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
    provide_live();
    // Effects run only in the browser, so this flips once the page is hydrated; browser
    // tests wait for it before they click.
    let (hydrated, set_hydrated) = signal(false);
    Effect::new(move |_| set_hydrated.set(true));
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
                <nav aria-label="Main">
                    <A href="/" exact=true>"Overview"</A>
                    <A href="/hosts">"Hosts"</A>
                    <A href="/services">"Services"</A>
                    <A href="/task-definitions">"Task definitions"</A>
                </nav>
            </header>
            <main id="main" data-hydrated=move || hydrated.get().then_some("true")>
                <Routes fallback=|| view! { <NotFound /> }>
                    <Route path=path!("/") view=OverviewPage />
                    <Route path=path!("/hosts") view=HostsPage />
                    <Route path=path!("/hosts/:id") view=HostPage />
                    <Route path=path!("/services") view=ServicesPage />
                    <Route path=path!("/services/new") view=ServiceWizardPage />
                    <Route path=path!("/services/:name") view=ServicePage />
                    <Route path=path!("/task-definitions") view=TaskDefinitionsPage />
                    <Route path=path!("/task-definitions/new") view=TaskDefinitionEditorPage />
                    <Route path=path!("/task-definitions/:family") view=TaskDefinitionPage />
                </Routes>
            </main>
        </Router>
    }
}

#[component]
fn NotFound() -> impl IntoView {
    #[cfg(feature = "ssr")]
    if let Some(response) = use_context::<leptos_axum::ResponseOptions>() {
        response.set_status(http::StatusCode::NOT_FOUND);
    }
    view! {
        <Title text="Not found" />
        <h1>"Page not found"</h1>
        <p>
            "There is no page here. " <a href="/hosts">"Go to the hosts"</a> "."
        </p>
    }
}
