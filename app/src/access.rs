//! What each console server function needs from its caller, declared once beside the
//! function with [`guard!`] (a [`Declaration`]: a REST operation's twin names the same one).
//! The server enforces it, a project's role included (a registered server function without
//! a declaration is refused), and the console disables a control whose server function the
//! signed-in caller may not call ([`allowed`], [`allowed_in`]).

use leptos::prelude::*;
pub use tessera_model::auth::Access;
use tessera_model::auth::Caller;
pub use tessera_model::operations::{self as ops, Declaration};

/// The signed-in caller, loaded once per page load (the shell provides it); pages ask
/// [`allowed`] what it may do.
#[derive(Clone, Copy)]
pub struct SignedIn(pub Resource<Result<Option<Caller>, ServerFnError>>);

/// A server function and the access it needs.
pub trait Guarded {
    const DECLARED: Declaration;
}

/// One server function's declaration, as the server reads them all ([`rules`]).
#[cfg(feature = "ssr")]
#[derive(Debug)]
pub struct Rule {
    /// The server function's URL path.
    pub path: &'static str,
    /// Its type's name, for logs and tests.
    pub name: &'static str,
    pub declared: Declaration,
    /// The argument that holds the body a REST twin would take (`input`, `patch`): its
    /// declaration's scope names fields of it. `None`: the arguments themselves.
    pub body: Option<&'static str>,
    /// Its arguments read from a request's query and body by the function's own decoder
    /// ([`decode::arguments`]), as JSON: what the layer checks is what the function gets.
    pub arguments: fn(&str, &[u8]) -> Result<serde_json::Value, String>,
}

/// A server function's arguments, read by the decoder its own protocol uses.
#[cfg(feature = "ssr")]
pub mod decode {
    use leptos::server_fn::codec::{GetUrl, Json, JsonEncoding, PostUrl};
    use leptos::server_fn::{Bytes, Decodes, Http, ServerFn};
    use serde::Serialize;
    use serde::de::DeserializeOwned;

    /// The encoding of a protocol's input.
    pub trait InputOf {
        type Input: Encoding;
    }

    impl<I: Encoding, O> InputOf for Http<I, O> {
        type Input = I;
    }

    /// Reads arguments as `server_fn` does for this encoding (a server function with an
    /// encoding not here does not compile with `guard!`).
    pub trait Encoding {
        fn read<F: DeserializeOwned>(query: &str, body: &[u8]) -> Result<F, String>;
    }

    /// `server_fn`'s own: `serde_qs` with depth 5, not strict, over the UTF-8 body.
    impl Encoding for PostUrl {
        fn read<F: DeserializeOwned>(_: &str, body: &[u8]) -> Result<F, String> {
            let text = std::str::from_utf8(body).map_err(|e| e.to_string())?;
            serde_qs::Config::new(5, false)
                .deserialize_str(text)
                .map_err(|e| e.to_string())
        }
    }

    /// As [`PostUrl`], over the query.
    impl Encoding for GetUrl {
        fn read<F: DeserializeOwned>(query: &str, _: &[u8]) -> Result<F, String> {
            serde_qs::Config::new(5, false)
                .deserialize_str(query)
                .map_err(|e| e.to_string())
        }
    }

    impl Encoding for Json {
        fn read<F: DeserializeOwned>(_: &str, body: &[u8]) -> Result<F, String> {
            <JsonEncoding as Decodes<F>>::decode(Bytes::copy_from_slice(body))
                .map_err(|e| e.to_string())
        }
    }

    /// The arguments of server function `F` in a request, decoded as `F` decodes them and
    /// written back as JSON (every argument by its name).
    pub fn arguments<F>(query: &str, body: &[u8]) -> Result<serde_json::Value, String>
    where
        F: ServerFn + DeserializeOwned + Serialize,
        F::Protocol: InputOf,
    {
        let args: F = <<F::Protocol as InputOf>::Input as Encoding>::read(query, body)?;
        serde_json::to_value(&args).map_err(|e| e.to_string())
    }
}

#[cfg(feature = "ssr")]
inventory::collect!(Rule);

#[cfg(feature = "ssr")]
impl Rule {
    /// The function's own name (`set_host_draining` for `SetHostDraining`), as the audit log
    /// names it.
    pub fn function(&self) -> String {
        let mut out = String::with_capacity(self.name.len() + 4);
        for (i, c) in self.name.chars().enumerate() {
            if c.is_ascii_uppercase() && i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        }
        out
    }
}

/// Every server function's declaration.
#[cfg(feature = "ssr")]
pub fn rules() -> impl Iterator<Item = &'static Rule> {
    inventory::iter::<Rule>.into_iter()
}

/// Declares what the server function `$fn` (its generated type) needs, right after the
/// function: `guard!(MakePlan, Declaration::OPERATE);`, or for a REST operation's twin its
/// declaration, naming the argument that holds the REST body when its scope reads fields of
/// it: `guard!(PatchService, ops::UPDATE_SERVICE, body = patch);`.
macro_rules! guard {
    ($fn:ident, $declared:expr) => {
        $crate::access::guard!(@ $fn, $declared, None);
    };
    ($fn:ident, $declared:expr, body = $body:ident) => {
        $crate::access::guard!(@ $fn, $declared, Some(stringify!($body)));
    };
    (@ $fn:ident, $declared:expr, $body:expr) => {
        impl $crate::access::Guarded for $fn {
            const DECLARED: $crate::access::Declaration = $declared;
        }
        #[cfg(feature = "ssr")]
        ::inventory::submit! {
            $crate::access::Rule {
                path: <$fn as ::leptos::server_fn::ServerFn>::PATH,
                name: stringify!($fn),
                declared: $declared,
                body: $body,
                arguments: $crate::access::decode::arguments::<$fn>,
            }
        }
    };
}
pub(crate) use guard;

/// Why a control that calls the server function `F` is disabled for the signed-in caller,
/// or `None` when it may be used. The server refuses the call anyway; this only spares the
/// operator the attempt. For an operation in a project whose project the page does not
/// know yet (a new service's), a caller with the role in some project may try.
pub fn allowed<F: Guarded>() -> Signal<Option<String>> {
    allowed_in::<F>(Signal::derive(|| None))
}

/// As [`allowed`], for an operation on something in `project` (a service's page): the
/// caller's role there, as the server will check it.
pub fn allowed_in<F: Guarded>(project: Signal<Option<String>>) -> Signal<Option<String>> {
    let Some(needed) = F::DECLARED.access.role() else {
        return Signal::derive(|| None);
    };
    let in_project = matches!(F::DECLARED.access, Access::InProject(_));
    let signed_in = use_context::<SignedIn>();
    Signal::derive(move || {
        let caller = signed_in
            .and_then(|s| s.0.get())
            .and_then(Result::ok)
            .flatten();
        let Some(c) = caller else {
            return Some("sign in first".to_owned());
        };
        let (has, where_) = match (in_project, project.get()) {
            (true, Some(p)) => (c.role_in(&p), format!(" in project {p}")),
            (true, None) => (Some(c.best_role()), String::new()),
            (false, _) => (Some(c.role), String::new()),
        };
        match has {
            Some(r) if r.allows(needed) => None,
            Some(r) => Some(format!("needs the {needed} role{where_}; you are {r}")),
            None => Some(format!("{} acts in another project only", c.actor())),
        }
    })
}
