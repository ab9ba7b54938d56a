//! Shared by the fuzz targets.

#![allow(dead_code)]

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

/// libfuzzer-sys installs a panic hook that aborts at once, before any `catch_unwind` can run.
/// The runtime catches some panics on purpose (candle's GGUF header reader, the `tokenizers`
/// library in `Tokenizer::encode` / `decode`) and turns them into errors, so they are not
/// crashes here either. This hook prints each panic location once and returns; a panic that
/// nothing catches still unwinds to libfuzzer-sys, which aborts and records the input.
pub fn report_panics_once() {
    static SEEN: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    std::panic::set_hook(Box::new(|info| {
        let at = info.location().map_or_else(|| "?".to_string(), |l| format!("{}:{}", l.file(), l.line()));
        let mut seen = SEEN.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
        if seen.insert(at.clone()) {
            let payload = info.payload();
            let msg = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            eprintln!("fuzz: panic at {at}: {msg} (a crash only if nothing catches it)");
        }
    }));
}

/// `data` as text, or `None`: the runtime reads JSON and template files with
/// `read_to_string`, which rejects invalid UTF-8, so only valid text reaches the parsers.
pub fn text(data: &[u8]) -> Option<&str> {
    std::str::from_utf8(data).ok()
}

/// With `FUZZ_VERBOSE=1` in the environment, prints what each stage made of the input
/// (`.../target/release/<target> <file>` to see why a seed or a crash input goes where it goes).
pub fn show<T, E: std::fmt::Display>(stage: &str, r: &Result<T, E>) {
    static VERBOSE: OnceLock<bool> = OnceLock::new();
    if *VERBOSE.get_or_init(|| std::env::var_os("FUZZ_VERBOSE").is_some_and(|v| v == "1")) {
        match r {
            Ok(_) => eprintln!("{stage}: ok"),
            Err(e) => eprintln!("{stage}: {e}"),
        }
    }
}

/// Runs `f` on a thread with the stack the runtime gives untrusted work
/// (`expert_runtime::stack::UNTRUSTED_STACK`), as the runtime runs format compilation and chat
/// templates: its depth bounds are sized for that stack, not for the fuzzer's main thread (and
/// AddressSanitizer's frames are several times larger). A panic goes on on the caller's thread.
pub fn on_untrusted_stack<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        let h = expert_runtime::stack::untrusted_thread("fuzz").spawn_scoped(s, f).expect("a fuzz thread starts");
        h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}
