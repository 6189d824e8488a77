//! Adding hosts, for admins (on the Hosts page): mint a join token scoped to a pool, an
//! expiry and a number of uses, shown once with the agent's command; list and delete
//! them.

use crate::access::{Declaration, guard};
use crate::components::RoleHint;
use leptos::prelude::*;
use tessera_model::auth::{JoinTokenInfo, JoinTokenInput, NewJoinToken};

/// The minted join tokens (never their values), and the pools to scope new ones to.
#[server]
pub async fn list_join_tokens() -> Result<(Vec<JoinTokenInfo>, Vec<String>), ServerFnError> {
    let control = crate::data::ssr::control_for::<ListJoinTokens>()?;
    let tokens = control
        .agents()
        .list_join_tokens()
        .await
        .map_err(crate::data::ssr::failed)?;
    let pools = control
        .views()
        .list_pools()
        .await
        .map_err(crate::data::ssr::failed)?
        .into_iter()
        .map(|p| p.name.to_string())
        .collect();
    Ok((tokens, pools))
}

guard!(ListJoinTokens, Declaration::ADMIN);

/// Mints a join token; its value is in this answer only.
#[server]
pub async fn mint_join_token(input: JoinTokenInput) -> Result<NewJoinToken, ServerFnError> {
    let control = crate::data::ssr::control_for::<MintJoinToken>()?;
    let caller = crate::data::ssr::caller().ok_or_else(|| ServerFnError::new("sign in first"))?;
    control
        .agents()
        .mint_join_token(&caller, &input)
        .await
        .map_err(crate::data::ssr::failed)
}

guard!(MintJoinToken, Declaration::ADMIN);

#[server]
pub async fn delete_join_token(id: String) -> Result<(), ServerFnError> {
    let control = crate::data::ssr::control_for::<DeleteJoinToken>()?;
    control
        .agents()
        .delete_join_token(&id)
        .await
        .map_err(crate::data::ssr::failed)
}

guard!(DeleteJoinToken, Declaration::ADMIN);

/// The panel, for admins only (others see nothing of it).
#[component]
pub fn JoinTokens() -> impl IntoView {
    let admin = crate::access::allowed::<ListJoinTokens>();
    move || admin.get().is_none().then(|| view! { <JoinTokensPanel /> })
}

#[component]
fn JoinTokensPanel() -> impl IntoView {
    let mint = Action::new(|input: &JoinTokenInput| mint_join_token(input.clone()));
    let delete = Action::new(|id: &String| delete_join_token(id.clone()));
    let data = Resource::new(
        move || (mint.version().get(), delete.version().get()),
        |_| list_join_tokens(),
    );
    let admin = crate::access::allowed::<MintJoinToken>();
    let pool = RwSignal::new(String::new());
    let uses = RwSignal::new("1".to_owned());
    let hours = RwSignal::new("24".to_owned());
    let preapproved = RwSignal::new(false);
    let description = RwSignal::new(String::new());
    let submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        let pool = pool.get_untracked();
        mint.dispatch(JoinTokenInput {
            description: description.get_untracked(),
            pool: (!pool.is_empty()).then_some(pool),
            host: None,
            expires_in_secs: hours
                .get_untracked()
                .trim()
                .parse::<u64>()
                .ok()
                .map(|h| h.saturating_mul(3600)),
            uses: uses.get_untracked().trim().parse().ok(),
            preapproved: preapproved.get_untracked(),
        });
    };
    view! {
        <section class="panel join-tokens" aria-labelledby="join-tokens-title">
            <h2 id="join-tokens-title">"Add hosts"</h2>
            <p class="muted">
                "An agent registers with a join token: scoped to a pool, an expiry and a number of uses. It is shown once; give it to the agent in a file ("
                <code>"tessera-agent --join-token-file FILE"</code>
                ") or in "<code>"TESSERA_AGENT_JOIN_TOKEN"</code>", never on its command line, where every process on the host can read it."
            </p>
            <form class="controls" on:submit=submit>
                <Transition fallback=|| ()>
                    {move || Suspend::new(async move {
                        let pools = data.await.map(|(_, pools)| pools).unwrap_or_default();
                        view! {
                            <label>"Registers in "
                                <select name="token-pool" on:change=move |ev| pool.set(event_target_value(&ev))>
                                    <option value="">"any"</option>
                                    {pools.into_iter().map(|p| view! { <option value=p.clone()>{p.clone()}</option> }).collect_view()}
                                </select>
                            </label>
                        }
                    })}
                </Transition>
                <label>"Hosts "
                    <input type="number" name="uses" min="1" max="10000" prop:value=uses on:input=move |ev| uses.set(event_target_value(&ev)) />
                </label>
                <label>"Valid for (hours) "
                    <input type="number" name="hours" min="1" max="720" prop:value=hours on:input=move |ev| hours.set(event_target_value(&ev)) />
                </label>
                <label>
                    <input type="checkbox" name="preapproved" prop:checked=preapproved on:change=move |ev| preapproved.set(event_target_checked(&ev)) />
                    " pre-approved"
                </label>
                <label>"Description (optional, shown in the list below; at most 200 characters) "
                    <input type="text" name="description" maxlength="200" prop:value=description on:input=move |ev| description.set(event_target_value(&ev)) />
                </label>
                <button type="submit" class="primary" title=move || admin.get() disabled=move || admin.get().is_some()>"Mint join token"</button>
            </form>
            <RoleHint reason=admin />
            {move || mint.value().get().map(|r| match r {
                Ok(t) => view! {
                    <div class="minted" role="status">
                        <p>"Join token " <code>{t.info.id.clone()}</code> " (shown this once):"</p>
                        <pre><code>{t.token.clone()}</code></pre>
                        <p class="muted">"On the host: save it to a file readable by root only, then "
                            <code>{format!("tessera-agent --server URL --pool {} --join-token-file FILE --state-dir DIR", t.info.pool.clone().unwrap_or_else(|| "POOL".into()))}</code>
                        </p>
                    </div>
                }.into_any(),
                Err(e) => view! { <p class="field-error" role="alert">{e.to_string()}</p> }.into_any(),
            })}
            {move || delete.value().get().and_then(Result::err).map(|e| view! { <p class="field-error" role="alert">{e.to_string()}</p> })}
            <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
                {move || Suspend::new(async move {
                    match data.await {
                        Ok((tokens, _)) if tokens.is_empty() => view! { <p class="muted">"No join tokens minted."</p> }.into_any(),
                        Ok((tokens, _)) => view! {
                            <table class="table join-token-list">
                                <thead><tr><th>"Token"</th><th>"Pool"</th><th>"Hosts left"</th><th>"Registered"</th><th>"Expires"</th><th>"Description"</th><th></th></tr></thead>
                                <tbody>
                                    {tokens.into_iter().map(|t| {
                                        let id = t.id.clone();
                                        view! {
                                            <tr>
                                                <td><code>{t.id.clone()}</code>{t.preapproved.then_some(" (pre-approved)")}</td>
                                                <td>{t.host.clone().map(|h| format!("rejoins {h}")).or(t.pool.clone()).unwrap_or_else(|| "any".into())}</td>
                                                <td>{t.uses_left}</td>
                                                <td>{t.uses}</td>
                                                <td>{t.expires_at.short()}</td>
                                                <td>{t.description.clone()}</td>
                                                <td><button type="button" class="danger" on:click=move |_| { delete.dispatch(id.clone()); }>"Delete"</button></td>
                                            </tr>
                                        }
                                    }).collect_view()}
                                </tbody>
                            </table>
                        }.into_any(),
                        Err(e) => view! { <p class="field-error" role="alert">{e.to_string()}</p> }.into_any(),
                    }
                })}
            </Transition>
        </section>
    }
}
