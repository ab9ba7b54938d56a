//! The header of an adapter's safetensors file, read without copying or buffering it.
//!
//! `safetensors::SafeTensors::deserialize` parses the JSON header through a flattened map,
//! which makes serde buffer every entry as a generic value first: for a rank-16 LoRA on every
//! projection of a 28-layer model (392 tensors, a 52 KB header) that was 250 µs, more than
//! the rest of attaching the adapter. Here serde_json reads the entries straight into the
//! crate's own `TensorInfo`, and the crate's `Metadata::new` validates them as its own parser
//! does (offsets contiguous from 0, each byte range the size its dtype and shape need); the
//! checks around it (header length, data section length) are the crate's too.

use std::collections::{HashMap, HashSet};
use std::fmt;

use safetensors::tensor::{Metadata, TensorInfo};
use serde::de::{Deserializer, MapAccess, Visitor};

/// The `safetensors` crate's bound on a header.
const MAX_HEADER_SIZE: usize = 100_000_000;

/// Where a file's tensors are: the start of the data section and every tensor (name and
/// info, offsets relative to that start), in file order.
pub struct Header {
    pub data_start: usize,
    pub tensors: Vec<(String, TensorInfo)>,
}

/// Parses and validates the header of the safetensors file `bytes`. The error is a sentence
/// for a message.
pub fn read_header(bytes: &[u8]) -> Result<Header, String> {
    let len = bytes.get(..8).ok_or("the file is shorter than a safetensors header")?;
    let n = u64::from_le_bytes(len.try_into().expect("8 bytes"));
    let n = usize::try_from(n).ok().filter(|&n| n <= MAX_HEADER_SIZE).ok_or("the header length is too large")?;
    let json = bytes.get(8..8 + n).ok_or("the header is longer than the file")?;
    let Entries(mut tensors) = serde_json::from_slice(json).map_err(|e| format!("the header is not valid: {e}"))?;
    tensors.sort_by_key(|(_, info)| info.data_offsets);
    let mut seen = HashSet::with_capacity(tensors.len());
    for (name, _) in &tensors {
        if !seen.insert(name.as_str()) {
            return Err(format!("tensor {name} appears twice in the header"));
        }
    }
    let metadata = Metadata::new(None, tensors.clone()).map_err(|e| format!("the header is not valid: {e}"))?;
    if metadata.data_len().checked_add(8 + n) != Some(bytes.len()) {
        return Err(format!(
            "the header describes {} bytes of tensor data, the file holds {}",
            metadata.data_len(),
            bytes.len() - 8 - n
        ));
    }
    Ok(Header { data_start: 8 + n, tensors })
}

/// The header's tensor entries; `__metadata__` (string to string) is checked and dropped.
struct Entries(Vec<(String, TensorInfo)>);

impl<'de> serde::Deserialize<'de> for Entries {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Entries;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map of tensor names to their dtype, shape and data_offsets")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entries, A::Error> {
                let mut tensors = Vec::with_capacity(map.size_hint().unwrap_or(0).min(1 << 16));
                while let Some(name) = map.next_key::<String>()? {
                    if name == "__metadata__" {
                        map.next_value::<HashMap<String, String>>()?;
                    } else {
                        let info = map.next_value::<TensorInfo>()?;
                        tensors.push((name, info));
                    }
                }
                Ok(Entries(tensors))
            }
        }
        d.deserialize_map(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file with this header JSON and `data` bytes after it.
    fn file(header: &str, data: usize) -> Vec<u8> {
        let mut v = (header.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(header.as_bytes());
        v.resize(v.len() + data, 0);
        v
    }

    #[test]
    fn reads_what_safetensors_reads() {
        let h = r#"{"__metadata__":{"format":"pt"},"b":{"dtype":"F32","shape":[2,2],"data_offsets":[8,24]},"a":{"dtype":"F16","shape":[4],"data_offsets":[0,8]}}"#;
        let bytes = file(h, 24);
        let got = read_header(&bytes).unwrap();
        assert_eq!(got.data_start, 8 + h.len());
        let names: Vec<&str> = got.tensors.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        for (name, info) in &got.tensors {
            let view = st.tensor(name).unwrap();
            assert_eq!((view.dtype(), view.shape()), (info.dtype, info.shape.as_slice()));
        }
    }

    #[test]
    fn refuses_what_safetensors_refuses_and_duplicates() {
        let t = |s: &str| format!(r#"{{"x":{{"dtype":"F32","shape":[2],"data_offsets":{s}}}}}"#);
        let bad: Vec<(Vec<u8>, &str)> = vec![
            (vec![1, 2, 3], "shorter"),
            (file(&t("[0,8]"), 4), "holds 4"),
            (file(&t("[0,8]"), 12), "holds 12"),
            (file(&t("[4,12]"), 12), "not valid"),
            (file(&t("[0,4]"), 4), "not valid"),
            (file(&t("[0,18446744073709551615]"), 8), "not valid"),
            (
                file(r#"{"x":{"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,18446744073709551615]}}"#, 8),
                "not valid",
            ),
            (file(r#"{"x":{"dtype":"U8","shape":[1099511627776],"data_offsets":[0,1099511627776]}}"#, 8), "holds 8"),
            (file(r#"{"x":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}}"#, 8), "not valid"),
            (file(r#"{"x":1}"#, 0), "not valid"),
            (file(r#"[1,2]"#, 0), "not valid"),
            (file(r#"{"__metadata__":{"a":1}}"#, 0), "not valid"),
            (
                file(
                    r#"{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#,
                    8,
                ),
                "appears twice",
            ),
        ];
        for (bytes, want) in bad {
            let e = read_header(&bytes).err().unwrap_or_else(|| panic!("accepted {:?}", String::from_utf8_lossy(&bytes)));
            assert!(e.contains(want), "{e} (expected: {want})");
        }
        let mut huge = file("{}", 0);
        huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(read_header(&huge).err().unwrap().contains("too large"));
    }
}
