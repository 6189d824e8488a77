//! Users and API tokens, for admins: add a user, change a user's role, disable or enable
//! one (the last enabled admin stays, as the API says); make an API token (shown once) and
//! delete one. The same rules and messages as `POST`/`PATCH /api/v1/users` and
//! `POST`/`DELETE /api/v1/tokens`.

use crate::access::{Declaration, guard};
use crate::components::{ErrorList, FieldErrors, RoleHint};
use leptos::prelude::*;
use leptos_meta::Title;
use tessera_model::auth::{ApiTokenInfo, NewApiToken, Role, UserInfo};
use tessera_model::taskdef::FieldError;

/// Refused input comes back as field errors, anything else as the error.
type Answer<T> = Result<Result<T, Vec<FieldError>>, ServerFnError>;
/// Makes a token: its name, role, project and days until it expires.
type MintAction = Action<(String, Role, Option<String>, Option<u32>), Answer<NewApiToken>>;
/// Changes a user's role and/or disabled flag.
type ChangeAction = Action<(String, Option<Role>, Option<bool>), Answer<UserInfo>>;

#[server]
pub async fn list_accounts() -> Result<(Vec<UserInfo>, Vec<ApiTokenInfo>), ServerFnError> {
    use crate::data::ssr::{control_for, failed};
    let control = control_for::<ListAccounts>()?;
    let users = control.accounts().list_users().await.map_err(failed)?;
    let tokens = control.accounts().list_api_tokens().await.map_err(failed)?;
    Ok((users, tokens))
}

guard!(ListAccounts, Declaration::ADMIN);

#[server]
pub async fn add_user(username: String, password: String, role: Role) -> Answer<UserInfo> {
    let control = crate::data::ssr::control_for::<AddUser>()?;
    match control
        .accounts()
        .add_user(&username, &password, role)
        .await
    {
        Ok(u) => Ok(Ok(u)),
        Err(e) => crate::data::ssr::refused(e).map(Err),
    }
}

guard!(AddUser, Declaration::ADMIN);

/// Changes a user's role and/or disabled flag; disabling also deletes the user's API
/// tokens (a disabled account's tokens would still work otherwise). A refusal (the last
/// enabled admin stays) comes back as field errors.
#[server]
pub async fn change_user(
    username: String,
    role: Option<Role>,
    disabled: Option<bool>,
) -> Answer<UserInfo> {
    use crate::data::ssr::{control_for, failed, refused};
    let control = control_for::<ChangeUser>()?;
    let user = match control
        .accounts()
        .update_user(&username, role, disabled, None)
        .await
    {
        Ok(u) => u,
        Err(e) => return refused(e).map(Err),
    };
    if disabled == Some(true) {
        control
            .accounts()
            .revoke_user_tokens(&username)
            .await
            .map_err(failed)?;
    }
    Ok(Ok(user))
}

guard!(ChangeUser, Declaration::ADMIN);

#[server]
pub async fn make_token(
    name: String,
    role: Role,
    project: Option<String>,
    expires_in_days: Option<u32>,
) -> Answer<NewApiToken> {
    let control = crate::data::ssr::control_for::<MakeToken>()?;
    let caller = crate::data::ssr::caller().ok_or_else(|| ServerFnError::new("sign in first"))?;
    match control
        .accounts()
        .create_api_token(&caller, &name, role, project.as_deref(), expires_in_days)
        .await
    {
        Ok(t) => Ok(Ok(t)),
        Err(e) => crate::data::ssr::refused(e).map(Err),
    }
}

guard!(MakeToken, Declaration::ADMIN);

#[server]
pub async fn remove_token(id: String) -> Result<(), ServerFnError> {
    crate::data::ssr::control_for::<RemoveToken>()?
        .accounts()
        .delete_api_token(&id)
        .await
        .map_err(crate::data::ssr::failed)
}

guard!(RemoveToken, Declaration::ADMIN);

#[component]
pub fn UsersPage() -> impl IntoView {
    let add = Action::new(|(u, p, r): &(String, String, Role)| add_user(u.clone(), p.clone(), *r));
    let change = Action::new(|(u, r, d): &(String, Option<Role>, Option<bool>)| {
        change_user(u.clone(), *r, *d)
    });
    let mint = Action::new(
        |(n, r, p, d): &(String, Role, Option<String>, Option<u32>)| {
            make_token(n.clone(), *r, p.clone(), *d)
        },
    );
    let remove = Action::new(|id: &String| remove_token(id.clone()));
    let data = Resource::new(
        move || {
            (
                add.version().get(),
                change.version().get(),
                mint.version().get(),
                remove.version().get(),
            )
        },
        |_| list_accounts(),
    );
    view! {
        <Title text="Users and tokens" />
        <div class="page-head">
            <h1>"Users and tokens"</h1>
            <p class="lede">"Who may sign in, with which role, and the API tokens scripts and Prometheus use."</p>
        </div>
        <UserForm add />
        <TokenForm mint />
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            <ErrorBoundary fallback=|errors| view! { <ErrorList errors /> }>
                {move || Suspend::new(async move {
                    data.await.map(|(users, tokens)| view! {
                        <Users users change />
                        <Tokens tokens remove />
                    })
                })}
            </ErrorBoundary>
        </Transition>
    }
}

/// A role picker over `roles`, setting `to`.
fn role_select(
    name: &'static str,
    to: RwSignal<Role>,
    roles: &'static [Role],
) -> impl IntoView + use<> {
    view! {
        <select name=name on:change=move |ev| {
            if let Ok(r) = event_target_value(&ev).parse() { to.set(r) }
        }>
            {roles.iter().map(|r| view! { <option value=r.as_str() selected=move || to.get() == *r>{r.as_str()}</option> }).collect_view()}
        </select>
    }
}

#[component]
fn UserForm(add: Action<(String, String, Role), Answer<UserInfo>>) -> impl IntoView {
    let admin = crate::access::allowed::<AddUser>();
    let username = RwSignal::new(String::new());
    let password = RwSignal::new(String::new());
    let role = RwSignal::new(Role::Viewer);
    let errors = Signal::derive(move || match add.value().get() {
        Some(Ok(Err(e))) => e,
        _ => Vec::new(),
    });
    let submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        add.dispatch((
            username.get_untracked(),
            password.get_untracked(),
            role.get_untracked(),
        ));
    };
    view! {
        <section class="panel">
            <h2>"Add a user"</h2>
            <form class="controls" aria-label="New user" on:submit=submit>
                <label>"Username " <input type="text" name="username" autocomplete="off" prop:value=username on:input=move |ev| username.set(event_target_value(&ev)) />
                    <FieldErrors errors field="username".to_owned() /></label>
                <label>"Password " <input type="password" name="password" autocomplete="new-password" prop:value=password on:input=move |ev| password.set(event_target_value(&ev)) />
                    <FieldErrors errors field="password".to_owned() /></label>
                <label>"Role " {role_select("role", role, Role::ALL)}</label>
                <button type="submit" class="primary" title=move || admin.get() disabled=move || admin.get().is_some()>"Add user"</button>
            </form>
            <RoleHint reason=admin />
            {move || match add.value().get() {
                Some(Ok(Ok(u))) => Some(view! { <p class="notice" role="status">{format!("User {} added as {}.", u.username, u.role)}</p> }.into_any()),
                Some(Ok(Err(e))) => crate::components::request_refusal(e),
                Some(Err(e)) => Some(view! { <p class="field-error" role="alert">{e.to_string()}</p> }.into_any()),
                _ => None,
            }}
        </section>
    }
}

#[component]
fn TokenForm(mint: MintAction) -> impl IntoView {
    let admin = crate::access::allowed::<MakeToken>();
    let name = RwSignal::new(String::new());
    let role = RwSignal::new(Role::Viewer);
    let project = RwSignal::new(String::new());
    let days = RwSignal::new("90".to_owned());
    let days_error = RwSignal::new(None::<String>);
    let errors = Signal::derive(move || {
        let mut e = match mint.value().get() {
            Some(Ok(Err(e))) => e,
            _ => Vec::new(),
        };
        if let Some(m) = days_error.get() {
            e.push(FieldError {
                field: "expires_in_days".into(),
                message: m,
            });
        }
        e
    });
    let submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        let d = days.get_untracked();
        let expires = match d.trim() {
            "" => None,
            t => {
                match t.parse::<u32>() {
                    Ok(n) => Some(n),
                    Err(_) => {
                        days_error.set(Some(format!("must be a whole number of days (or empty: it does not expire), got {t:?}")));
                        return;
                    }
                }
            }
        };
        days_error.set(None);
        let p = project.get_untracked();
        mint.dispatch((
            name.get_untracked(),
            role.get_untracked(),
            (!p.trim().is_empty()).then(|| p.trim().to_owned()),
            expires,
        ));
    };
    view! {
        <section class="panel">
            <h2>"Make an API token"</h2>
            <form class="controls" aria-label="New API token" on:submit=submit>
                <label>"Name " <input type="text" name="token-name" prop:value=name on:input=move |ev| name.set(event_target_value(&ev)) />
                    <small class="muted">"e.g. prometheus"</small>
                    <FieldErrors errors field="name".to_owned() /></label>
                <label>"Role " {role_select("token-role", role, Role::ALL)}<FieldErrors errors field="role".to_owned() /></label>
                <label>"Only project " <input type="text" name="token-project" prop:value=project on:input=move |ev| project.set(event_target_value(&ev)) />
                    <small class="muted">"optional"</small>
                    <FieldErrors errors field="project".to_owned() /></label>
                <label>"Expires in (days) " <input type="text" inputmode="numeric" name="expires_in_days" prop:value=days on:input=move |ev| days.set(event_target_value(&ev)) />
                    <small class="muted">"empty: never"</small>
                    <FieldErrors errors field="expires_in_days".to_owned() /></label>
                <button type="submit" class="primary" title=move || admin.get() disabled=move || admin.get().is_some()>"Make token"</button>
            </form>
            <RoleHint reason=admin />
            {move || match mint.value().get() {
                Some(Ok(Ok(t))) => Some(view! {
                    <div class="minted" role="status">
                        <p>{format!("Token {} ({}) made. Send it as Authorization: Bearer …; it is shown this once:", t.info.name, t.info.role)}</p>
                        <pre><code>{t.token.clone()}</code></pre>
                    </div>
                }.into_any()),
                Some(Ok(Err(e))) => crate::components::request_refusal(e),
                Some(Err(e)) => Some(view! { <p class="field-error" role="alert">{e.to_string()}</p> }.into_any()),
                _ => None,
            }}
        </section>
    }
}

#[component]
fn Users(users: Vec<UserInfo>, change: ChangeAction) -> impl IntoView {
    view! {
        <section class="panel">
            <h2>"Users"</h2>
            {move || match change.value().get() {
                Some(Ok(Err(e))) => Some(e.into_iter().map(|e| e.message).collect::<Vec<_>>().join("; ")),
                Some(Err(e)) => Some(e.to_string()),
                _ => None,
            }.map(|m| view! { <p class="field-error" role="alert">{m}</p> })}
            <table class="table users">
                <thead><tr><th>"User"</th><th>"Role"</th><th>"State"</th><th>"Since"</th><th></th></tr></thead>
                <tbody>
                    {users.into_iter().map(|u| {
                        let (n1, n2) = (u.username.clone(), u.username.clone());
                        let disabled = u.disabled;
                        view! {
                            <tr data-user=u.username.clone() class=if disabled { "disabled" } else { "" }>
                                <td>{u.username.clone()}</td>
                                <td>
                                    <select name="user-role" aria-label=format!("Role of {}", u.username) on:change=move |ev| {
                                        if let Ok(r) = event_target_value(&ev).parse::<Role>() { change.dispatch((n1.clone(), Some(r), None)); }
                                    }>
                                        {Role::ALL.iter().map(|r| view! { <option value=r.as_str() selected=*r == u.role>{r.as_str()}</option> }).collect_view()}
                                    </select>
                                </td>
                                <td>{if disabled { "disabled" } else { "enabled" }}</td>
                                <td>{u.created_at.short()}</td>
                                <td>
                                    <button type="button" class=if disabled { "" } else { "danger" }
                                        title=if disabled { "It may sign in again" } else { "It may not sign in, and its API tokens are deleted" }
                                        on:click=move |_| { change.dispatch((n2.clone(), None, Some(!disabled))); }>
                                        {if disabled { "Enable" } else { "Disable" }}
                                    </button>
                                </td>
                            </tr>
                        }
                    }).collect_view()}
                </tbody>
            </table>
        </section>
    }
}

#[component]
fn Tokens(
    tokens: Vec<ApiTokenInfo>,
    remove: Action<String, Result<(), ServerFnError>>,
) -> impl IntoView {
    view! {
        <section class="panel">
            <h2>"API tokens"</h2>
            {if tokens.is_empty() {
                view! { <p class="muted">"No API token."</p> }.into_any()
            } else {
                view! {
                    <table class="table tokens">
                        <thead><tr><th>"Name"</th><th>"Role"</th><th>"Project"</th><th>"Made by"</th><th>"Expires"</th><th></th></tr></thead>
                        <tbody>
                            {tokens.into_iter().map(|t| {
                                let id = t.id.clone();
                                view! {
                                    <tr data-token=t.id.clone()>
                                        <td>{t.name.clone()}</td>
                                        <td>{t.role.as_str()}</td>
                                        <td>{t.project.clone().unwrap_or_else(|| "every project".into())}</td>
                                        <td>{t.created_by.clone()}</td>
                                        <td>{t.expires_at.map_or_else(|| "never".to_owned(), |e| e.short())}</td>
                                        <td><button type="button" class="danger" on:click=move |_| { remove.dispatch(id.clone()); }>"Delete"</button></td>
                                    </tr>
                                }
                            }).collect_view()}
                        </tbody>
                    </table>
                }.into_any()
            }}
        </section>
    }
}
