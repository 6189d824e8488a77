//! What the console's pages show: the read models (`tessera_model::views`, built by the
//! control plane) and, on the server, how a page reaches the control plane.

pub use tessera_model::views::*;

/// A stable colour for a service, so its slots look alike on every host.
pub fn service_hue(service: &str) -> u32 {
    service
        .bytes()
        .fold(7u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)))
        % 360
}

/// The field a refusal of the request as a whole (a name taken, a thing not found) comes
/// under, beside forms' own fields (`ssr::refused`; shown by
/// `crate::components::request_refusal`).
pub const REQUEST_FIELD: &str = "(request)";

#[cfg(feature = "ssr")]
pub(crate) mod ssr {
    //! How a page reaches the control plane, and how its errors are shown.

    use leptos::prelude::*;
    use tessera_control::{Control, ControlError, Told};

    /// Who is calling, as the server's authentication layer found it on the request.
    pub fn caller() -> Option<tessera_model::auth::Caller> {
        use_context::<http::request::Parts>()?
            .extensions
            .get::<tessera_model::auth::Caller>()
            .cloned()
    }

    /// The control plane, provided by the server to every page and server function; only
    /// to a signed-in caller (the authentication layer checks each server function's role
    /// before it runs; this keeps a page rendered without a caller from reading anything).
    pub fn control() -> Result<Control, ServerFnError> {
        if caller().is_none() {
            return Err(ServerFnError::new("sign in first"));
        }
        use_context::<Control>()
            .ok_or_else(|| ServerFnError::new("the console is not connected to the control plane"))
    }

    /// The control plane, to a caller the server function `F` admits (its declared role
    /// fleet-wide). A page rendered on the server calls its server functions in process, past
    /// the layer that checks them over HTTP: one that reads what only some roles may read
    /// checks the caller itself. (Server functions in a project are actions, called over
    /// HTTP only, where the layer checks their project.)
    pub fn control_for<F: crate::access::Guarded>() -> Result<Control, ServerFnError> {
        let Some(role) = F::DECLARED.access.role() else {
            return control();
        };
        match caller() {
            Some(c) if c.role.allows(role) => control(),
            Some(_) => Err(ServerFnError::new(format!(
                "this needs the {} role",
                role.as_str()
            ))),
            None => Err(ServerFnError::new("sign in first")),
        }
    }

    /// A failure the operator cannot act on: logged with its cause, shown without it.
    pub fn internal(e: impl std::fmt::Display) -> ServerFnError {
        tracing::error!(error = %e, "console request failed");
        ServerFnError::new("the server could not answer; its log has the cause")
    }

    /// A control-plane error as the operator should see it: what they can act on (not
    /// found, invalid, conflict, busy) in words; a store error as [`internal`], never its
    /// text (it can name tables, paths and the database's own words). Every server function
    /// maps control errors through this one function (or takes field errors first).
    pub fn failed(e: ControlError) -> ServerFnError {
        told(e.told())
    }

    /// What the operator is told (the control plane's one mapping, [`Told`]) as a server
    /// function's error: an internal failure logged with its cause.
    pub fn told(t: Told) -> ServerFnError {
        match t {
            Told::Internal(e) => internal(e),
            other => ServerFnError::new(other.to_string()),
        }
    }

    /// A refusal a form shows in the page rather than as a failed request: invalid
    /// fields, and a thing not found or in conflict under the field `(request)`; `Err`
    /// with what the operator is told otherwise.
    pub fn refused(
        e: ControlError,
    ) -> Result<Vec<tessera_model::taskdef::FieldError>, ServerFnError> {
        match e.told() {
            Told::Invalid(fields) => Ok(fields),
            Told::NotFound(m) | Told::Conflict(m) => Ok(vec![tessera_model::taskdef::FieldError {
                field: crate::data::REQUEST_FIELD.into(),
                message: m,
            }]),
            other => Err(told(other)),
        }
    }

    /// The field errors a form shows, where the operator is told of fields; `Err` with
    /// what they are told otherwise.
    pub fn field_errors(
        e: ControlError,
    ) -> Result<Vec<tessera_model::taskdef::FieldError>, ServerFnError> {
        match e.told() {
            Told::Invalid(fields) => Ok(fields),
            other => Err(told(other)),
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use tessera_control::StoreError;

        #[test]
        fn a_store_error_reaches_the_browser_without_its_text() {
            let leaked = "no such table: tasks_secret_column at /var/lib/tessera/tessera.db";
            let shown = failed(ControlError::Store(StoreError::Conflict(leaked.into())));
            assert!(!shown.to_string().contains("tasks_secret"), "{shown}");
            assert!(
                shown.to_string().contains("its log has the cause"),
                "{shown}"
            );
            let refused = failed(ControlError::Conflict(
                "service web is being deleted".into(),
            ));
            assert!(refused.to_string().contains("service web is being deleted"));
        }
    }
}
