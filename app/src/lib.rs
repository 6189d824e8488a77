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
    // A panic (a page's code that could not be fetched stops the WASM) is logged, and the
    // page says so with a way back instead of going dead without a word.
    std::panic::set_hook(Box::new(|info| {
        console_error_panic_hook::hook(info);
        say_the_page_broke();
    }));
    // Lazy routes (split WASM) need the hydration that can wait for a page's code.
    leptos::mount::hydrate_lazy(App);
}

/// Puts a notice at the top of the page: part of it could not load; reload to try again.
#[cfg(feature = "hydrate")]
fn say_the_page_broke() {
    let Some(document) = web_sys::window().and_then(|w| w.document()) else {
        return;
    };
    if document.get_element_by_id("console-broken").is_some() {
        return;
    }
    let Ok(notice) = document.create_element("div") else {
        return;
    };
    notice.set_id("console-broken");
    notice.set_class_name("notice broken");
    let _ = notice.set_attribute("role", "alert");
    notice.set_inner_html(
        "<p>Part of this page could not load, so it stopped (the server may have been busy). <a href=\"\" rel=\"external\">Reload the page</a> to try again.</p>",
    );
    if let Some(body) = document.body() {
        let _ = body.prepend_with_node_1(&notice);
    }
}
