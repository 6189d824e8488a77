//! The handling of the client commands other than `apply`, `preview` and `lb`: sign-in,
//! `get` and `describe`, hosts, pools' providers, join tokens and events.

pub(super) mod describe;
pub(super) mod events;
pub(super) mod get;
pub(super) mod hosts;
pub(super) mod join_tokens;
pub(super) mod pools;
pub(super) mod session;
pub(super) mod streams;

use serde::Serialize;

fn print_json<T: Serialize>(v: &T) -> anyhow::Result<()> {
    say!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}
