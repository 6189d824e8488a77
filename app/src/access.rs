//! What each console server function needs from its caller, declared once beside the
//! function with [`guard!`]. The server enforces it (a registered server function without a
//! declaration is refused), and the console disables a control whose server function the
//! signed-in caller may not call ([`allowed`]).

use leptos::prelude::*;
pub use tessera_model::auth::Access;
use tessera_model::auth::Caller;

/// The signed-in caller, loaded once per page load (the shell provides it); pages ask
/// [`allowed`] what it may do.
#[derive(Clone, Copy)]
pub struct SignedIn(pub Resource<Result<Option<Caller>, ServerFnError>>);

/// A server function and the access it needs.
pub trait Guarded {
    const ACCESS: Access;
}

/// One server function's declaration, as the server reads them all ([`rules`]).
#[cfg(feature = "ssr")]
#[derive(Debug)]
pub struct Rule {
    /// The server function's URL path.
    pub path: &'static str,
    /// Its type's name, for logs and tests.
    pub name: &'static str,
    pub access: Access,
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

/// Declares what the server function `$fn` (its generated type) needs: `guard!(PatchService,
/// Access::OPERATE);` right after the function.
macro_rules! guard {
    ($fn:ident, $access:expr) => {
        impl $crate::access::Guarded for $fn {
            const ACCESS: $crate::access::Access = $access;
        }
        #[cfg(feature = "ssr")]
        ::inventory::submit! {
            $crate::access::Rule {
                path: <$fn as ::leptos::server_fn::ServerFn>::PATH,
                name: stringify!($fn),
                access: $access,
            }
        }
    };
}
pub(crate) use guard;

/// Why a control that calls the server function `F` is disabled for the signed-in caller,
/// or `None` when it may be used. The server refuses the call anyway; this only spares the
/// operator the attempt.
pub fn allowed<F: Guarded>() -> Signal<Option<String>> {
    let Some(needed) = F::ACCESS.role() else {
        return Signal::derive(|| None);
    };
    let signed_in = use_context::<SignedIn>();
    Signal::derive(move || {
        let caller = signed_in
            .and_then(|s| s.0.get())
            .and_then(Result::ok)
            .flatten();
        // An operation in a project: a caller with the role in some project may try (the
        // server checks the project acted on).
        let has = |c: &Caller| match F::ACCESS {
            Access::InProject(_) => c.best_role(),
            _ => c.role,
        };
        match caller {
            Some(c) if has(&c).allows(needed) => None,
            Some(c) => Some(format!("needs the {needed} role; you are {}", has(&c))),
            None => Some("sign in first".to_owned()),
        }
    })
}
