//! The task page's Logs panel: its lines read from its host and followed as they come
//! (server-sent events from `GET /api/v1/tasks/{id}/logs?follow=true`), a search that
//! keeps the lines holding its words, and a download of the whole logs as text. For
//! operators of its project (and admins); every read is in the audit log.

use leptos::prelude::*;

/// Most lines the panel keeps (the oldest go first).
#[cfg(feature = "hydrate")]
const KEPT: usize = 5000;
/// Lines read before following.
const TAIL: u32 = 500;

#[cfg(feature = "hydrate")]
thread_local! {
    static SOURCE: std::cell::RefCell<Option<web_sys::EventSource>> =
        const { std::cell::RefCell::new(None) };
}

/// Closes the panel's stream, if one is open (when its page goes).
pub fn stop() {
    #[cfg(feature = "hydrate")]
    SOURCE.with(|s| {
        if let Some(source) = s.borrow_mut().take() {
            source.close();
        }
    });
}

/// Opens the stream of `url` into `lines`; its end (or failure) into `ended`.
#[cfg(feature = "hydrate")]
fn follow(url: &str, lines: RwSignal<Vec<String>>, ended: RwSignal<Option<String>>) {
    use wasm_bindgen::JsCast;
    use wasm_bindgen::closure::Closure;
    stop();
    let Ok(source) = web_sys::EventSource::new(url) else {
        ended.set(Some("the logs could not be opened".into()));
        return;
    };
    let on_line =
        Closure::<dyn FnMut(web_sys::MessageEvent)>::new(move |e: web_sys::MessageEvent| {
            let line = e.data().as_string().unwrap_or_default();
            lines.update(|l| {
                l.push(line);
                if l.len() > KEPT {
                    let extra = l.len() - KEPT;
                    l.drain(..extra);
                }
            });
        });
    source.set_onmessage(Some(on_line.as_ref().unchecked_ref()));
    let on_end =
        Closure::<dyn FnMut(web_sys::MessageEvent)>::new(move |e: web_sys::MessageEvent| {
            let said = e.data().as_string().unwrap_or_default();
            let reason = serde_json::from_str::<serde_json::Value>(&said)
                .ok()
                .and_then(|v| v["reason"].as_str().map(str::to_owned))
                .unwrap_or(said);
            ended.set(Some(reason));
            // Ended for good: the browser would open it again.
            stop();
        });
    let _ = source.add_event_listener_with_callback("end", on_end.as_ref().unchecked_ref());
    let on_error = Closure::<dyn FnMut()>::new(move || {
        if ended.get_untracked().is_none() {
            ended.set(Some(
                "the stream was cut (signed out, not allowed, or the server went away)".into(),
            ));
        }
        stop();
    });
    source.set_onerror(Some(on_error.as_ref().unchecked_ref()));
    on_line.forget();
    on_end.forget();
    on_error.forget();
    SOURCE.with(|s| *s.borrow_mut() = Some(source));
}

/// What the panel shows, held by the page: a live refresh redraws the panel, and the
/// lines read (and the stream that brings more) stay.
#[derive(Clone, Copy)]
pub struct LogsState {
    /// The task whose logs are followed.
    task: RwSignal<Option<String>>,
    lines: RwSignal<Vec<String>>,
    ended: RwSignal<Option<String>>,
    search: RwSignal<String>,
}

impl LogsState {
    pub fn new() -> LogsState {
        LogsState {
            task: RwSignal::new(None),
            lines: RwSignal::new(Vec::new()),
            ended: RwSignal::new(None),
            search: RwSignal::new(String::new()),
        }
    }
}

impl Default for LogsState {
    fn default() -> Self {
        LogsState::new()
    }
}

#[component]
pub fn LogsPanel(
    task_id: String,
    allowed: Signal<Option<String>>,
    state: LogsState,
) -> impl IntoView {
    let LogsState {
        task,
        lines,
        ended,
        search,
    } = state;
    let open = {
        let task_id = task_id.clone();
        Signal::derive(move || task.get().as_deref() == Some(task_id.as_str()))
    };
    let url = format!("/api/v1/tasks/{task_id}/logs?follow=true&tail={TAIL}");
    let download = format!("/api/v1/tasks/{task_id}/logs?timestamps=true");
    let start = move |_| {
        lines.set(Vec::new());
        ended.set(None);
        task.set(Some(task_id.clone()));
        #[cfg(feature = "hydrate")]
        follow(&url, lines, ended);
        #[cfg(not(feature = "hydrate"))]
        let _ = &url;
    };
    let shown = move || {
        let words = search.get().to_lowercase();
        lines.with(|l| {
            l.iter()
                .filter(|line| words.is_empty() || line.to_lowercase().contains(&words))
                .cloned()
                .collect::<Vec<_>>()
                .join("\n")
        })
    };
    view! {
        <div class="logs" role="region" aria-label="Logs">
            <div class="controls">
                <button type="button" class="follow-logs" title=move || allowed.get()
                    disabled=move || allowed.get().is_some()
                    on:click=start>
                    {move || if open.get() { "Read again and follow" } else { "Follow its logs" }}
                </button>
                <label>"Search " <input type="search" name="log-search" placeholder="words in a line"
                    prop:value=search on:input=move |ev| search.set(event_target_value(&ev)) /></label>
                <a class="download" href=download download="task.log">"Download"</a>
            </div>
            {move || open.get().then(|| view! {
                <pre class="log-lines">{shown}</pre>
                <p class="muted log-status">{move || ended.get().unwrap_or_else(|| format!("following; {} lines", lines.with(Vec::len)))}</p>
            })}
        </div>
    }
}
