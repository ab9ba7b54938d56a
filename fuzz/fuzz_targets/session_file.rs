//! A session file, as `Runtime.restoreSession` reads one: the format (`session_file::decode`:
//! magic, version, header, sizes, checksum) and then the cache images written into a small
//! pool (`KvManager::import_table`: every size checked against the pool). The input is read
//! twice: as it is, and with a valid checksum appended, so mutations get past the CRC-32.

#![no_main]

mod common;

use candle_core::{DType, Device};
use expert_runtime::engine::session_file::decode;
use expert_runtime::kv::{KvManager, KvStore};
use libfuzzer_sys::fuzz_target;

fuzz_target!(init: common::report_panics_once(), |data: &[u8]| {
    let mut sealed = data.to_vec();
    sealed.extend_from_slice(&crc32fast::hash(data).to_le_bytes());
    for bytes in [data, &sealed[..]] {
        let file = decode(bytes);
        common::show("session file", &file.as_ref().map(|f| f.header.positions));
        let Ok(file) = file else { continue };
        // 2 layers, 1 KV head of 4 values, blocks of 4 positions: 128 bytes a block in f32.
        let Ok(store) = KvStore::new(2, 8, 4, 1, 4, DType::F32, &Device::Cpu) else { continue };
        let mut kv = KvManager::new(store, true);
        let t = kv.import_table(&file.cache);
        common::show("imported", &t.as_ref().map(|t| t.as_ref().map(|t| t.len())));
        if let Ok(Some(mut t)) = t {
            let _ = kv.export_table(&t);
            kv.free(&mut t);
        }
    }
});
