//! Embeddings and routing on the engine: [`Engine::embed`] (texts → pooled final hidden
//! states, evaluated as rows of the engine's passes), [`Engine::route`] (a query → the
//! router's decision), and `experts: 'auto'` requests, which are routed before they are
//! queued and then pin the chosen set like any other request.
//!
//! A query is embedded only when some loaded expert carries `routing.examples`; otherwise
//! routing is keywords only and runs on the caller's thread in microseconds.

use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};

use super::prepare::{self, Pending};
use super::request::{Command, EmbedRequest, Event, Input, Pooling};
use super::{disposed, Engine, GenericReference, Live};
use crate::error::{panic_message, EngineError, Result};
use crate::experts::router::{self, Candidate, Decision, Embedded, KeywordIndex, Router, RouterSettings};
use crate::experts::{Expert, ExpertSet};
use crate::tokenizer::{ChatMessage, Tokenizer};

/// Texts one `embed` call may hold.
pub const MAX_EMBED_TEXTS: usize = 65_536;
/// A routed query is embedded from its first this many tokens (keywords see all of it).
pub const ROUTE_EMBED_TOKENS: usize = 512;
/// A routed text is its first this many bytes (keywords, generic patterns and the embedding
/// see no further), so routing a huge message costs at most about a millisecond.
pub const ROUTE_TEXT_BYTES: usize = 64 * 1024;
/// Routing compares last-token states: on the models measured (SmolLM2-135M) they separate
/// domains better than the mean (`benches/routing.mjs`).
const ROUTE_POOLING: Pooling = Pooling::Last;

#[derive(Clone, Debug, Default)]
pub struct EmbedOptions {
    pub pooling: Pooling,
    /// Unit length (the default in the bindings).
    pub normalize: bool,
    /// The adapters the texts run under.
    pub experts: Vec<String>,
}

type Reply<T> = Box<dyn FnOnce(Result<T>) + Send>;

/// The resident experts' keyword index, with the registry generation it was built for.
#[derive(Clone, Default)]
pub(super) struct IndexCache(Arc<Mutex<Option<BuiltIndex>>>);

/// A keyword index and the registry generation it was built for.
type BuiltIndex = (u64, Arc<KeywordIndex>);

impl IndexCache {
    /// The index of `experts` (generation `generation`), built only when the set changed.
    fn get(&self, generation: u64, experts: &[Arc<Expert>]) -> Arc<KeywordIndex> {
        let mut cache = self.0.lock().unwrap();
        match &*cache {
            Some((g, ix)) if *g == generation => ix.clone(),
            _ => {
                let ix = Arc::new(KeywordIndex::new(&candidates(experts)));
                *cache = Some((generation, ix.clone()));
                ix
            }
        }
    }
}

impl Engine {
    /// One vector per text (`hidden_size` long): the final hidden state after the final norm,
    /// pooled. Texts are tokenized with the tokenizer's default special tokens (special
    /// spellings inside them are plain text) on the preparation pool.
    pub fn embed(&self, texts: Vec<String>, opts: EmbedOptions) -> tokio::sync::oneshot::Receiver<Result<Vec<Vec<f32>>>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.embed_then(texts, opts, Box::new(move |r| drop(tx.send(r))));
        rx
    }

    /// Blocking [`Self::embed`], for Rust callers and tests.
    pub fn embed_blocking(&self, texts: Vec<String>, opts: EmbedOptions) -> Result<Vec<Vec<f32>>> {
        self.embed(texts, opts).blocking_recv().map_err(|_| disposed())?
    }

    fn embed_then(&self, texts: Vec<String>, opts: EmbedOptions, reply: Reply<Vec<Vec<f32>>>) {
        let parts = (|| {
            if texts.len() > MAX_EMBED_TEXTS {
                return Err(EngineError::InvalidArgument(format!(
                    "embed takes at most {MAX_EMBED_TEXTS} texts per call ({} given)",
                    texts.len()
                )));
            }
            // Each text is one sequence of the context (refused before it is tokenized).
            for t in &texts {
                prepare::check_text_bytes(t.len(), self.info.context_length)?;
            }
            let experts = self.experts()?.resolve(&opts.experts)?;
            Ok((self.tokenizer()?, self.sender()?, experts))
        })();
        let (tok, tx, experts) = match parts {
            Ok(p) => p,
            Err(e) => return reply(Err(e)),
        };
        let job = move || {
            let ids = guarded(|| texts.iter().map(|t| embed_ids(&tok, t, usize::MAX)).collect::<Result<Vec<_>>>());
            match ids {
                Ok(ids) => send_embed(&tx, ids, opts.pooling, experts, opts.normalize, reply),
                Err(e) => reply(Err(e)),
            }
        };
        // When the pool cannot start, the job and its reply are dropped: the caller's receiver
        // then reports the engine as gone.
        let _ = prepare::spawn(job);
    }

    /// The router's decision for `input` (a string or a conversation: the last user message,
    /// with `history_turns` earlier user turns when set).
    pub fn route(&self, input: Input, history_turns: Option<usize>) -> tokio::sync::oneshot::Receiver<Result<Decision>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        match self.routing_query(&input, &[], history_turns) {
            Ok(q) => self.route_then(q, Box::new(move |r| drop(tx.send(r.map(|(d, _)| d))))),
            Err(e) => drop(tx.send(Err(e))),
        }
        rx
    }

    /// Blocking [`Self::route`].
    pub fn route_blocking(&self, input: Input, history_turns: Option<usize>) -> Result<Decision> {
        self.route(input, history_turns).blocking_recv().map_err(|_| disposed())?
    }

    /// Replaces the router's settings (checked first).
    pub fn set_router(&self, settings: RouterSettings) -> Result<()> {
        let r = Router::new(settings)?;
        *self.router.write().unwrap() = Arc::new(r);
        Ok(())
    }

    pub fn router_settings(&self) -> RouterSettings {
        self.router.read().unwrap().settings().clone()
    }

    /// The text a request is routed on.
    fn routing_query(&self, input: &Input, history: &[ChatMessage], history_turns: Option<usize>) -> Result<String> {
        let turns = history_turns.unwrap_or_else(|| self.router.read().unwrap().settings().history_turns);
        Ok(match input {
            Input::Text(t) => clip(t).to_string(),
            Input::Tokens(ids) => {
                let vocab = self.info.vocab_size;
                if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
                    return Err(EngineError::InvalidArgument(format!("token id {bad} is out of range (vocab size {vocab})")));
                }
                let ids = &ids[..ids.len().min(ROUTE_TEXT_BYTES / 4)];
                clip(&self.tokenizer()?.decode(ids, true).map_err(EngineError::Internal)?).to_string()
            }
            Input::Chat(messages) => {
                let users: Vec<&str> =
                    history.iter().chain(messages).filter(|m| m.role == "user").map(|m| m.content.as_str()).collect();
                let from = users.len().saturating_sub(turns.saturating_add(1));
                let mut q = String::new();
                for u in &users[from..] {
                    if !q.is_empty() {
                        q.push('\n');
                    }
                    q.push_str(clip(u));
                    if q.len() >= ROUTE_TEXT_BYTES {
                        break;
                    }
                }
                clip(&q).to_string()
            }
        })
    }

    /// Routes `query` and calls `then` with the decision and the chosen experts, pinned: at
    /// once (keywords only), or once its embedding comes back from the engine thread (on that
    /// thread: `then` must be quick). The decision is made and its experts pinned in one step
    /// over the experts loaded then (`Registry::with_loaded`), so an expert unloaded while a
    /// query is embedded is never chosen.
    fn route_then(&self, query: String, then: Reply<(Decision, ExpertSet)>) {
        let parts = (|| Ok((self.router.read().unwrap().clone(), self.experts()?, self.tokenizer()?, self.sender()?)))();
        let (router, registry, tok, tx) = match parts {
            Ok(p) => p,
            Err(e) => return then(Err(e)),
        };
        let cache = self.route_index.clone();
        let text = query.clone();
        let loaded = registry.list();
        let decide_pinned = move |embedding: Option<Embedded>| {
            registry.with_loaded(|generation, experts| {
                let d = decide(&router, &query, embedding, experts, &cache.get(generation, experts));
                let chosen = experts.iter().filter(|e| d.experts.contains(&e.name)).cloned().collect();
                (d, ExpertSet::new(chosen))
            })
        };
        let Some(generic) = self.reference_if_embedding(&loaded, &text) else {
            return then(Ok(decide_pinned(None)));
        };
        let job = move || {
            let ids = match guarded(|| embed_ids(&tok, &text, ROUTE_EMBED_TOKENS)) {
                Ok(ids) => ids,
                Err(e) => return then(Err(e)),
            };
            let reply: Reply<Vec<Vec<f32>>> = Box::new(move |r| {
                then(r.map(|mut v| {
                    let q = v.pop().unwrap_or_default();
                    decide_pinned(Some(Embedded { query: &q, generic: &generic }))
                }))
            });
            send_embed(&tx, vec![ids], ROUTE_POOLING, ExpertSet::none(), false, reply);
        };
        let _ = prepare::spawn(job);
    }

    /// The decision for `input` now, when it needs no embedding (no loaded expert has examples);
    /// `None` when it does ([`Self::route`] then).
    pub fn route_now(&self, input: &Input, history_turns: Option<usize>) -> Result<Option<Decision>> {
        let query = self.routing_query(input, &[], history_turns)?;
        let (generation, experts) = self.experts()?.snapshot();
        if self.reference_if_embedding(&experts, &query).is_some() {
            return Ok(None);
        }
        let index = self.route_index.get(generation, &experts);
        Ok(Some(decide(&self.router.read().unwrap(), &query, None, &experts, &index)))
    }

    /// The generic references, when routing `query` over `experts` embeds it.
    fn reference_if_embedding(&self, experts: &[Arc<Expert>], query: &str) -> Option<Arc<Vec<Vec<f32>>>> {
        let wants = experts.iter().any(|e| !e.examples.is_empty()) && !query.trim().is_empty();
        self.generic_reference.lock().unwrap().clone().filter(|_| wants)
    }

    /// `experts: 'auto'`: routes the request's input, pins the chosen set and queues it. A
    /// failure ends the request with its error and frees the session.
    pub(super) fn route_and_submit(&self, live: &Live, pending: Pending) -> Result<()> {
        let query = {
            let history = pending.shared.history.lock().unwrap();
            self.routing_query(&pending.input, &history, None)?
        };
        let formats = live.formats.clone();
        self.route_then(
            query,
            Box::new(move |chosen| {
                let mut pending = pending;
                let err = match chosen {
                    Ok((d, set)) => {
                        pending.request.experts = set;
                        pending.request.routing = Some(d);
                        let (shared, events) = (pending.shared.clone(), pending.request.events.clone());
                        match prepare::submit(formats, pending) {
                            Ok(()) => return,
                            Err(e) => (e, shared, events),
                        }
                    }
                    Err(e) => (e, pending.shared, pending.request.events),
                };
                err.1.busy.store(false, std::sync::atomic::Ordering::Release);
                let _ = err.2.send(Event::Error(err.0));
            }),
        );
        Ok(())
    }
}

/// Embeds `expert`'s `routing.examples` with the base model, and the generic reference
/// queries the first time (blocking: called on the adapter loader's thread).
pub(super) fn embed_examples(
    tok: &Tokenizer,
    tx: &Sender<Command>,
    generic: &GenericReference,
    expert: &mut Expert,
) -> Result<()> {
    let Some(examples) = expert.manifest.as_ref().map(|m| m.routing.examples.clone()).filter(|e| !e.is_empty()) else {
        return Ok(());
    };
    let embed = |texts: &[String]| -> Result<Vec<Vec<f32>>> {
        let ids = texts.iter().map(|t| embed_ids(tok, t, ROUTE_EMBED_TOKENS)).collect::<Result<Vec<_>>>()?;
        let (rtx, rrx) = std::sync::mpsc::channel();
        send_embed(tx, ids, ROUTE_POOLING, ExpertSet::none(), false, Box::new(move |r| drop(rtx.send(r))));
        rrx.recv().map_err(|_| disposed())?
    };
    if generic.lock().unwrap().is_none() {
        let refs: Vec<String> = router::DEFAULT_GENERIC_EXAMPLES.iter().map(|s| s.to_string()).collect();
        let v = Arc::new(embed(&refs)?);
        generic.lock().unwrap().get_or_insert(v);
    }
    expert.examples = embed(&examples)?;
    Ok(())
}

/// The router's decision over the resident experts (`index`: their keywords).
fn decide(router: &Router, query: &str, embedding: Option<Embedded>, experts: &[Arc<Expert>], index: &KeywordIndex) -> Decision {
    let mut d = router.route_indexed(query, embedding, &candidates(experts), index);
    if query.trim().is_empty() {
        d.reason = format!("{} (the routed text is empty)", d.reason);
    }
    d
}

static NO_ROUTING: std::sync::LazyLock<crate::experts::manifest::Routing> = std::sync::LazyLock::new(Default::default);

fn candidates(experts: &[Arc<Expert>]) -> Vec<Candidate<'_>> {
    experts
        .iter()
        .map(|e| {
            let r = e.manifest.as_ref().map_or(&*NO_ROUTING, |m| &m.routing);
            Candidate {
                name: &e.name,
                keywords: &r.keywords,
                exclude_keywords: &r.exclude_keywords,
                priority: r.priority,
                examples: &e.examples,
            }
        })
        .collect()
}

/// The start of `s`, at most [`ROUTE_TEXT_BYTES`] long (cut at a character boundary).
fn clip(s: &str) -> &str {
    if s.len() <= ROUTE_TEXT_BYTES {
        return s;
    }
    let mut end = ROUTE_TEXT_BYTES;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Token ids of a text to embed: the tokenizer's default special tokens, special spellings as
/// plain text, at most `max` tokens.
fn embed_ids(tok: &Tokenizer, text: &str, max: usize) -> Result<Vec<u32>> {
    let mut ids = tok.encode_text(text, true, false).map_err(EngineError::InvalidModel)?;
    ids.truncate(max);
    Ok(ids)
}

/// Queues an embedding on the engine thread; `reply` gets the (optionally normalized)
/// vectors.
fn send_embed(
    tx: &Sender<Command>,
    texts: Vec<Vec<u32>>,
    pooling: Pooling,
    experts: ExpertSet,
    normalize: bool,
    reply: Reply<Vec<Vec<f32>>>,
) {
    let reply: super::request::EmbedReply = Box::new(move |r| {
        reply(r.map(|mut v| {
            if normalize {
                v.iter_mut().for_each(|x| router::normalize(x));
            }
            v
        }))
    });
    if let Err(back) = tx.send(Command::Embed(Box::new(EmbedRequest { texts, pooling, experts, reply }))) {
        if let Command::Embed(req) = back.0 {
            (req.reply)(Err(disposed()));
        }
    }
}

fn guarded<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or_else(|p| Err(EngineError::Internal(format!("panic while tokenizing: {}", panic_message(&*p)))))
}
