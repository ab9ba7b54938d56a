//! The binding layer: the only place with `#[napi]`. It converts JS values to engine types
//! and engine errors to JS errors, and never does engine work on the JS thread.
mod error;
mod estimate;
mod expert;
mod inspect;
mod runtime;
mod session;
mod stream;
mod structured;
mod types;
