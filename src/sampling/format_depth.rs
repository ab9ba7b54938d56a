//! How deep compiling a response format can recurse, measured before it is compiled.
//!
//! Design note
//! -----------
//! llguidance compiles a JSON schema and a Lark grammar by recursion: a `$ref` is compiled
//! when first met, inside the compilation of the schema that names it, and a Lark rule inside
//! the rule that first uses it. A chain of 650 `$ref`s (22 KB) or 800 rules (10 KB) is enough
//! to overflow a 2 MiB stack, and a stack overflow is no panic: it kills the process. So every
//! format is measured here first, without recursion, and refused above [`MAX_FORMAT_DEPTH`];
//! the threads that compile run with a stack sized for that bound
//! ([`crate::stack::UNTRUSTED_STACK`], whose tests measure the worst case at the bound).
//!
//! The measure is an upper bound on the compiler's depth in *levels*: one level per nested
//! JSON container (a schema object, `properties`, an `anyOf` list…) or per Lark rule and
//! bracket nesting. The compilers memoise (a `$ref` target or a rule is compiled once, then
//! referred to), so a compilation's stack holds each target at most once; the bound is the
//! longest path through the graph of compile units (the schema's root and every `$ref` target;
//! every rule and token definition), each weighted by its own height, where a strongly
//! connected group (a recursive schema, mutually recursive rules) counts the sum of its
//! members' heights. Names and pointers are resolved conservatively: where a reference could
//! mean several things, it is counted as an edge to each.

use std::collections::HashMap;

use serde_json::Value;

/// Deepest format compilation accepted, in levels (see the module note). Real schemas (Zod,
/// Pydantic, OpenAPI) and grammars stay far below: a 40-model Pydantic schema nested 6 deep
/// measures about 60.
pub const MAX_FORMAT_DEPTH: usize = 1000;

/// Most reference edges a measurement follows; a format that needs more is refused as too
/// complex rather than measured for long.
const MAX_EDGES: usize = 1 << 20;

/// Levels counted for a name a Lark grammar uses but does not define (`%import common.X`:
/// llguidance's small built-in grammar; an undefined name fails to compile).
const IMPORTED_DEPTH: usize = 16;

/// Refuses a format whose compilation could recurse deeper than [`MAX_FORMAT_DEPTH`].
pub fn check_grammar(g: &llguidance::api::GrammarWithLexer) -> Result<(), String> {
    let (what, depth) = match (&g.json_schema, &g.lark_grammar) {
        (Some(schema), _) => ("$ref chains and nesting", schema_depth(schema)),
        (None, Some(lark)) => ("rule chains and nesting", lark_depth(lark)),
        (None, None) => return Ok(()),
    };
    if depth > MAX_FORMAT_DEPTH {
        let depth = if depth == usize::MAX { "more levels than can be measured".to_string() } else { format!("{depth} levels") };
        return Err(format!(
            "it nests too deeply: its {what} reach {depth}, at most {MAX_FORMAT_DEPTH} are accepted; \
             flatten long chains of references"
        ));
    }
    Ok(())
}

// ------------------------------------------------------------------ graph

/// The longest path through a directed graph whose nodes weigh `weight[i]`, where a strongly
/// connected component weighs the sum of its members (Tarjan's algorithm without recursion;
/// it emits components after every component they reach, so one pass in that order suffices).
fn longest_path(weight: &[usize], edges: &[Vec<usize>]) -> usize {
    let n = weight.len();
    const NONE: usize = usize::MAX;
    let (mut index, mut low, mut comp) = (vec![NONE; n], vec![0; n], vec![NONE; n]);
    let mut on_stack = vec![false; n];
    let (mut stack, mut comp_len) = (Vec::new(), Vec::<usize>::new());
    let mut next = 0;
    let mut best = 0;
    for root in 0..n {
        if index[root] != NONE {
            continue;
        }
        // (node, next edge to look at)
        let mut call = vec![(root, 0usize)];
        index[root] = next;
        low[root] = next;
        next += 1;
        stack.push(root);
        on_stack[root] = true;
        while let Some(&mut (v, ref mut e)) = call.last_mut() {
            if let Some(&w) = edges[v].get(*e) {
                *e += 1;
                if index[w] == NONE {
                    index[w] = next;
                    low[w] = next;
                    next += 1;
                    stack.push(w);
                    on_stack[w] = true;
                    call.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            call.pop();
            if let Some(&(parent, _)) = call.last() {
                low[parent] = low[parent].min(low[v]);
            }
            if low[v] == index[v] {
                // A component: its members, then its length (its successors are done).
                let c = comp_len.len();
                let mut members = Vec::new();
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    comp[w] = c;
                    members.push(w);
                    if w == v {
                        break;
                    }
                }
                let own: usize = members.iter().map(|&m| weight[m]).fold(0, usize::saturating_add);
                let after = members
                    .iter()
                    .flat_map(|&m| edges[m].iter())
                    .filter(|&&w| comp[w] != c)
                    .map(|&w| comp_len[comp[w]])
                    .max()
                    .unwrap_or(0);
                comp_len.push(own.saturating_add(after));
                best = best.max(comp_len[c]);
            }
        }
    }
    best
}

// ------------------------------------------------------------------ JSON schema

/// The most levels compiling `schema` can nest (see the module note).
pub fn schema_depth(schema: &Value) -> usize {
    // Every JSON container, in pre-order, with its parent.
    let mut nodes: Vec<(&Value, Option<usize>)> = Vec::new();
    let mut id_of: HashMap<*const Value, usize> = HashMap::new();
    let mut todo = vec![(schema, None)];
    while let Some((v, parent)) = todo.pop() {
        let children: Box<dyn Iterator<Item = &Value>> = match v {
            Value::Object(m) => Box::new(m.values()),
            Value::Array(a) => Box::new(a.iter()),
            _ => continue,
        };
        let id = nodes.len();
        nodes.push((v, parent));
        id_of.insert(v as *const Value, id);
        todo.extend(children.map(|c| (c, Some(id))));
    }
    if nodes.is_empty() {
        return 0;
    }
    // Heights, children before parents (reverse pre-order).
    let mut height = vec![1usize; nodes.len()];
    for i in (1..nodes.len()).rev() {
        if let Some(p) = nodes[i].1 {
            height[p] = height[p].max(height[i] + 1);
        }
    }
    // Where a reference may lead: every resource (`$id`) and anchor is a possible base.
    let resources: Vec<usize> = (0..nodes.len()).filter(|&i| has_str(nodes[i].0, &["$id", "id"])).collect();
    let anchors: Vec<usize> = (0..nodes.len()).filter(|&i| has_str(nodes[i].0, &["$anchor", "$dynamicAnchor"])).collect();
    let targets_of = |r: &str| -> Vec<usize> {
        let (uri, frag) = r.split_once('#').unwrap_or((r, ""));
        let mut out = Vec::new();
        if frag.is_empty() || frag.starts_with('/') {
            let bases: Vec<usize> =
                if uri.is_empty() { std::iter::once(0).chain(resources.iter().copied()).collect() } else { resources.clone() };
            let tokens: Vec<String> = frag.split('/').skip(1).map(pointer_token).collect();
            for b in bases {
                if let Some(t) = resolve(nodes[b].0, &tokens).and_then(|t| id_of.get(&(t as *const Value))) {
                    out.push(*t);
                }
            }
        } else {
            out.extend(anchors.iter().chain(&resources));
        }
        out
    };
    // Compile units: the root (unit 0) and every reference target (a node may be both).
    let mut unit_of: HashMap<usize, usize> = HashMap::new();
    let mut unit_node = vec![0usize];
    let mut sites: Vec<(usize, Vec<usize>)> = Vec::new();
    let mut n_edges = 0usize;
    for (i, (v, _)) in nodes.iter().enumerate() {
        let Some(m) = v.as_object() else { continue };
        for key in ["$ref", "$dynamicRef", "$recursiveRef"] {
            let Some(r) = m.get(key).and_then(Value::as_str) else { continue };
            let ts = targets_of(r);
            n_edges = n_edges.saturating_add(ts.len());
            if n_edges > MAX_EDGES {
                return usize::MAX;
            }
            for &t in &ts {
                let next = unit_node.len();
                unit_of.entry(t).or_insert_with(|| {
                    unit_node.push(t);
                    next
                });
            }
            sites.push((i, ts));
        }
    }
    let weight: Vec<usize> = unit_node.iter().map(|&n| height[n]).collect();
    let mut edges = vec![Vec::new(); unit_node.len()];
    for (site, ts) in &sites {
        // The units whose compilation contains the site: the root and every target above it.
        let mut at = Some(*site);
        let mut containing = vec![0usize];
        while let Some(a) = at {
            containing.extend(unit_of.get(&a));
            at = nodes[a].1;
        }
        n_edges = n_edges.saturating_add(containing.len() * ts.len());
        if n_edges > MAX_EDGES {
            return usize::MAX;
        }
        for &u in &containing {
            edges[u].extend(ts.iter().map(|t| unit_of[t]));
        }
    }
    longest_path(&weight, &edges)
}

fn has_str(v: &Value, keys: &[&str]) -> bool {
    keys.iter().any(|k| v.get(k).is_some_and(Value::is_string))
}

/// One JSON-pointer token of a URI fragment: percent-decoded, then `~1` → `/`, `~0` → `~`.
fn pointer_token(t: &str) -> String {
    let bytes = t.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1).and_then(|&b| hex(b)), bytes.get(i + 2).and_then(|&b| hex(b))) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).replace("~1", "/").replace("~0", "~")
}

fn resolve<'a>(mut v: &'a Value, tokens: &[String]) -> Option<&'a Value> {
    for t in tokens {
        v = match v {
            Value::Object(m) => m.get(t.as_str())?,
            Value::Array(a) => a.get(t.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(v)
}

// ------------------------------------------------------------------ Lark

/// One definition of a Lark grammar (a rule, a token, or a statement such as `%ignore`).
struct Definition {
    name: Option<String>,
    /// 1 + the deepest bracket nesting in its body (+ an embedded JSON schema's depth).
    height: usize,
    refs: Vec<String>,
}

/// The most levels compiling the Lark grammar `text` can nest (see the module note).
pub fn lark_depth(text: &str) -> usize {
    let defs = lark_definitions(text);
    let mut index: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, d) in defs.iter().enumerate() {
        if let Some(n) = &d.name {
            index.entry(n.as_str()).or_default().push(i);
        }
    }
    // Names used but not defined share one node (only when there are some).
    let mut weight: Vec<usize> = defs.iter().map(|d| d.height).collect();
    let imported = [weight.len()];
    if defs.iter().flat_map(|d| &d.refs).any(|r| !index.contains_key(r.as_str())) {
        weight.push(IMPORTED_DEPTH);
    }
    let mut edges = vec![Vec::new(); weight.len()];
    let mut n_edges = 0usize;
    for (i, d) in defs.iter().enumerate() {
        for r in &d.refs {
            let to = index.get(r.as_str()).map_or(&imported[..], Vec::as_slice);
            n_edges += to.len();
            if n_edges > MAX_EDGES {
                return usize::MAX;
            }
            edges[i].extend_from_slice(to);
        }
    }
    longest_path(&weight, &edges)
}

fn is_name_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_'
}

fn is_name(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}

/// Splits a Lark grammar into its definitions, with the names each body uses. A definition
/// starts where a line (or a `{` block) starts with `name:` / `NAME:` (with `?`, `!`,
/// parameters, a priority or attributes before the colon); statements (`%ignore`, `%import`)
/// are definitions without a name. Strings, regexes and comments are skipped; `%json`,
/// `%regex` and `%llguidance` values are read as JSON, a schema's depth added to its height.
fn lark_definitions(text: &str) -> Vec<Definition> {
    let b = text.as_bytes();
    let mut defs: Vec<Definition> = Vec::new();
    let mut cur = Definition { name: None, height: 1, refs: Vec::new() };
    let mut nesting = 0usize;
    let mut line_start = true;
    let mut i = 0;
    while i < b.len() {
        if line_start {
            line_start = false;
            let mut j = i;
            while j < b.len() && (b[j] == b' ' || b[j] == b'\t') {
                j += 1;
            }
            let head = definition_head(b, j);
            if head.is_some() || b.get(j) == Some(&b'%') {
                defs.push(std::mem::replace(&mut cur, Definition { name: None, height: 1, refs: Vec::new() }));
                nesting = 0;
            }
            if let Some((name, end)) = head {
                cur.name = Some(name);
                i = end;
                continue;
            }
        }
        match b[i] {
            b'\n' => {
                line_start = true;
                i += 1;
            }
            b'"' => i = skip_quoted(b, i, b'"'),
            b'/' if b.get(i + 1) == Some(&b'/') => i = skip_line(b, i),
            b'#' => i = skip_line(b, i),
            b'/' => i = skip_quoted(b, i, b'/'),
            b'(' | b'[' | b'{' => {
                nesting += 1;
                cur.height = cur.height.max(nesting + 1);
                // A `{` block may start definitions of its own (`%lark { … }`).
                line_start = b[i] == b'{';
                i += 1;
            }
            b')' | b']' | b'}' => {
                nesting = nesting.saturating_sub(1);
                i += 1;
            }
            b'%' => {
                let end = (i + 1..=b.len()).find(|&k| k == b.len() || !is_name(b[k])).unwrap_or(b.len());
                let kw = &text[i + 1..end];
                i = end;
                if matches!(kw, "json" | "regex" | "llguidance") {
                    let rest = &text[i..];
                    let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
                    if let Some(Ok(v)) = values.next() {
                        let depth = if kw == "json" { schema_depth(&v) } else { json_height(&v) };
                        cur.height = cur.height.max((nesting + 1).saturating_add(depth));
                        i += values.byte_offset();
                    }
                }
            }
            c if is_name_start(c) => {
                let end = (i..=b.len()).find(|&k| k == b.len() || !is_name(b[k])).unwrap_or(b.len());
                cur.refs.push(text[i..end].to_string());
                i = end;
            }
            _ => i += 1,
        }
    }
    defs.push(cur);
    defs
}

/// `name` and where its body starts, when a definition head starts at `j`.
fn definition_head(b: &[u8], mut j: usize) -> Option<(String, usize)> {
    while matches!(b.get(j), Some(b'!' | b'?')) {
        j += 1;
    }
    let start = j;
    if !b.get(j).copied().is_some_and(is_name_start) {
        return None;
    }
    while b.get(j).copied().is_some_and(is_name) {
        j += 1;
    }
    let name = String::from_utf8_lossy(&b[start..j]).into_owned();
    // Parameters `{…}`, a parametric marker `::_`, a priority `.N`, attributes `[…]`, spaces.
    loop {
        match b.get(j) {
            Some(b' ' | b'\t') => j += 1,
            Some(b'{') => j = b[j..].iter().position(|&c| c == b'}').map(|k| j + k + 1)?,
            Some(b'[') => j = b[j..].iter().position(|&c| c == b']').map(|k| j + k + 1)?,
            Some(b'.') => {
                j += 1;
                while b.get(j).is_some_and(|c| c.is_ascii_digit() || *c == b'-') {
                    j += 1;
                }
            }
            Some(b':') if b.get(j + 1) == Some(&b':') => j += 2,
            Some(b'_') => j += 1,
            Some(b':') => return Some((name, j + 1)),
            _ => return None,
        }
    }
}

fn skip_line(b: &[u8], i: usize) -> usize {
    b[i..].iter().position(|&c| c == b'\n').map_or(b.len(), |k| i + k)
}

/// Past the closing `q` of a string or regex starting at `i` (backslash escapes skipped), or
/// the end of the line when it is not closed.
fn skip_quoted(b: &[u8], i: usize, q: u8) -> usize {
    let mut k = i + 1;
    while k < b.len() && b[k] != b'\n' {
        if b[k] == b'\\' {
            k += 2;
        } else if b[k] == q {
            return k + 1;
        } else {
            k += 1;
        }
    }
    k.min(b.len())
}

/// Nesting of a JSON value's containers (iteratively).
fn json_height(v: &Value) -> usize {
    let mut best = 0;
    let mut todo = vec![(v, 1usize)];
    while let Some((v, d)) = todo.pop() {
        match v {
            Value::Object(m) => todo.extend(m.values().map(|c| (c, d + 1))),
            Value::Array(a) => todo.extend(a.iter().map(|c| (c, d + 1))),
            _ => continue,
        }
        best = best.max(d);
    }
    best
}

#[cfg(test)]
#[path = "format_depth_tests.rs"]
mod tests;
