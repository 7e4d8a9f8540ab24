//! Regenerates `fuzz/seeds/<target>/` — the starting corpus of every fuzz
//! target — from the frozen fixtures and the synthetic delta bases:
//!
//!     cd fuzz && cargo run --example gen_seeds
//!
//! The seeds are small valid inputs (plus a few near misses); libFuzzer
//! mutates them into hostile ones.

use std::fs;
use std::path::{Path, PathBuf};

use deltapack_format::delta;
use deltapack_format::root::ENVELOPE_HEADER_LEN;
use deltapack_fuzz::{fix_up, fuzz_key, snapshot, BASE_BOUNDARIES, CHUNK_TOKENS};

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    fs::create_dir_all(dir).expect("mkdir");
    fs::write(dir.join(name), bytes).expect("write seed");
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).expect("read_dir") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

fn main() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let fixtures = here.join("../fixtures/2026-11-v1v2");
    let seeds = here.join("seeds");
    let key = fuzz_key();

    // Roots: every fixture root as stored, its body alone (the target also
    // wraps inputs as bodies), and for the keyed target the same re-sealed
    // with the fuzzing key.
    for (i, p) in files_under(&fixtures.join("store/roots"))
        .iter()
        .enumerate()
    {
        let root = fs::read(p).expect("root");
        write(
            &seeds.join("root_decode"),
            &format!("fixture-root-{i}"),
            &root,
        );
        let body_end = root.len() - if root[10] & 1 == 1 { 32 } else { 0 };
        let body = &root[ENVELOPE_HEADER_LEN..body_end];
        write(
            &seeds.join("root_decode"),
            &format!("fixture-body-{i}"),
            body,
        );
        let sealed = fix_up(&root, Some(&key)).expect("fixture roots are envelopes");
        write(
            &seeds.join("root_decode_keyed"),
            &format!("sealed-root-{i}"),
            &sealed,
        );
        write(
            &seeds.join("root_decode_keyed"),
            &format!("fixture-root-{i}"),
            &root,
        );
        write(
            &seeds.join("root_decode_keyed"),
            &format!("fixture-body-{i}"),
            body,
        );
    }

    // Snapshots: the fixture inputs and the synthetic bases.
    for name in ["base-1024.snapshot", "result-4096.snapshot"] {
        let s = fs::read(fixtures.join("inputs").join(name)).expect("snapshot");
        write(&seeds.join("snapshot_decode"), name, &s);
    }
    for (i, b) in BASE_BOUNDARIES.iter().enumerate() {
        let s = snapshot(*b, i as u8);
        write(
            &seeds.join("snapshot_decode"),
            &format!("synthetic-{b}"),
            s.encoded(),
        );
    }

    // Deltas: selector byte + a valid delta from each base to several results.
    for (sel, &bb) in BASE_BOUNDARIES.iter().enumerate() {
        let base = snapshot(bb, 0);
        for (j, rb) in [bb + 16, bb + 32, 80].into_iter().enumerate() {
            if rb <= bb {
                continue;
            }
            let result = snapshot(rb, j as u8 + 1);
            let d = delta::encode(CHUNK_TOKENS, &base, &result).expect("delta");
            let mut input = vec![sel as u8];
            input.extend_from_slice(&d);
            write(
                &seeds.join("delta_apply"),
                &format!("base{bb}-result{rb}"),
                &input,
            );
        }
    }

    // Identities: the fixture identities plus one with attributes and a draft.
    for p in files_under(&fixtures.join("inputs")) {
        let name = p
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        if name.starts_with("identity-") {
            write(
                &seeds.join("identity_json"),
                &name,
                &fs::read(&p).expect("identity"),
            );
        }
    }
    let mut id = deltapack_format::CacheIdentity::example();
    id.draft_checkpoint = Some(deltapack_format::Digest::sha256(b"draft"));
    id.attributes.insert("gpu".into(), "h100".into());
    id.attributes.insert("kv_dtype".into(), "fp8".into());
    write(
        &seeds.join("identity_json"),
        "with-attributes.json",
        id.to_json_pretty().as_bytes(),
    );
    println!("seeds written to {}", seeds.display());
}
