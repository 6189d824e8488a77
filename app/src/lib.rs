//! Tessera's web console, rendered on the server and hydrated in the browser.
//!
//! The crate has no default features: `ssr` switches on the server side (server functions
//! that call the control plane), `hydrate` the browser side (the WASM entry point).
//!
//! # Layout
//! - [`access`]: what each server function needs from its caller, declared beside it.
//! - [`app`]: the HTML shell, the router and the navigation shared by every page.
//! - [`pages`]: one route per file (`HostsPage`, ...), each with the server functions it calls.
//! - [`components`]: pieces shared by pages (badges, GPU bars, meters, events, field errors).
//! - [`fit`]: fit evidence on the service page: verdicts, usage charts, blast radius, right-size.
//! - [`data`]: the views pages show, and (under `ssr`) how they are built from the control plane.
//! - [`live`]: live updates from the server's event stream.

// Deeply nested view types (a host card holds GPU bars that hold segments) need more
// room than the default when the release build computes their layout.
#![recursion_limit = "256"]

pub mod access;
pub mod app;
pub mod components;
pub mod data;
pub mod fit;
pub mod live;
pub mod pages;

pub use app::{App, shell};

/// The browser entry point: takes over the server-rendered page.
#[cfg(feature = "hydrate")]
#[wasm_bindgen::prelude::wasm_bindgen]
pub fn hydrate() {
    console_error_panic_hook::set_once();
    // Lazy routes (split WASM) need the hydration that can wait for a page's code.
    leptos::mount::hydrate_lazy(App);
}
