//! Signing in: a plain form posted to `POST /api/v1/session`, so it works before (or
//! without) the page's WASM; the server answers with a redirect to the page asked for.

use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_query_map;

#[component]
pub fn SignInPage() -> impl IntoView {
    let query = use_query_map();
    let next = move || query.read().get("next").unwrap_or_else(|| "/".into());
    let error = move || {
        let q = query.read();
        match q.get("error").as_deref() {
            Some("wrong") => {
                Some("Wrong username or password, or the account is disabled.".to_owned())
            }
            Some("limited") => Some(format!(
                "Too many failed sign-ins. Try again in {} seconds.",
                q.get("retry").unwrap_or_else(|| "60".into())
            )),
            Some(_) => Some("Signing in failed.".to_owned()),
            None => None,
        }
    };
    view! {
        <Title text="Sign in" />
        <section class="panel sign-in">
            <h1>"Sign in to Tessera"</h1>
            {move || error().map(|e| view! { <p class="error" role="alert">{e}</p> })}
            <form method="post" action="/api/v1/session">
                <input type="hidden" name="next" value=next />
                <label>
                    "Username"
                    <input name="username" autocomplete="username" required autofocus />
                </label>
                <label>
                    "Password"
                    <input name="password" type="password" autocomplete="current-password" required />
                </label>
                <button type="submit" class="primary">"Sign in"</button>
            </form>
            <p class="muted">
                "First start: the admin's password is printed once in the server's log. "
                "A locked-out operator: " <code>"tessera user passwd NAME"</code> " on the server."
            </p>
        </section>
    }
}
