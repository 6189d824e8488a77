//! Live updates: the server's event stream (`/api/v1/live`) bumps a counter that pages use
//! as a resource source, so they refetch when the fleet changes, without a reload.

use leptos::prelude::*;

/// Bumped on every change the server announces.
#[derive(Clone, Copy)]
pub struct LiveTick(pub RwSignal<u64>);

/// Provides the counter; in the browser, also opens the event stream once someone is
/// signed in (the stream needs a signed-in viewer; the sign-in page has none).
pub fn provide_live(signed_in: crate::access::SignedIn) -> LiveTick {
    let tick = LiveTick(RwSignal::new(0));
    provide_context(tick);
    let opened = StoredValue::new(false);
    // Effects run only in the browser.
    Effect::new(move |_| {
        let caller = signed_in.0.get().and_then(Result::ok).flatten();
        if caller.is_some() && !opened.get_value() {
            opened.set_value(true);
            #[cfg(feature = "hydrate")]
            open_stream(tick);
        }
    });
    tick
}

/// Closes the event stream and stops counting: called as the page signs out, so no
/// refetch races the session's end (it would be refused, and say so in the console).
pub fn stop() {
    #[cfg(feature = "hydrate")]
    STREAM.with(|s| {
        if let Some(source) = s.borrow_mut().take() {
            source.set_onmessage(None);
            source.set_onopen(None);
            source.close();
        }
    });
}

#[cfg(feature = "hydrate")]
thread_local! {
    static STREAM: std::cell::RefCell<Option<web_sys::EventSource>> =
        const { std::cell::RefCell::new(None) };
}

/// The counter, for use as a resource source.
pub fn use_live() -> impl Fn() -> u64 + Copy + Send + Sync + 'static {
    let tick = use_context::<LiveTick>().map(|t| t.0);
    move || tick.map_or(0, |t| t.get())
}

#[cfg(feature = "hydrate")]
fn open_stream(tick: LiveTick) {
    use wasm_bindgen::JsCast;
    use wasm_bindgen::closure::Closure;
    let Ok(source) = web_sys::EventSource::new("/api/v1/live") else {
        leptos::logging::warn!("live updates unavailable: EventSource could not open");
        return;
    };
    let on_message =
        Closure::<dyn FnMut(web_sys::MessageEvent)>::new(move |_: web_sys::MessageEvent| {
            tick.0.update(|n| *n += 1);
        });
    source.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
    // Once the stream is open (and again after the browser reconnects it), pages refetch:
    // what changed between the server's render and the connection was announced to nobody.
    let on_open = Closure::<dyn FnMut()>::new(move || {
        tick.0.update(|n| *n += 1);
    });
    source.set_onopen(Some(on_open.as_ref().unchecked_ref()));
    // Both live as long as the page (or until `stop`): the browser reconnects the stream
    // by itself.
    on_message.forget();
    on_open.forget();
    STREAM.with(|s| *s.borrow_mut() = Some(source));
}
