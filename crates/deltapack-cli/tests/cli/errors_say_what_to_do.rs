//! An error a new operator meets first says what to do, naming the store
//! as it was given: a bucket that does not exist (deltapack never creates
//! one) is named as such, with the command that creates it, instead of an
//! S3 `NoSuchBucket` buried in an object path.
//!
//! Against the S3 test server `.ci/run` starts (moto), a bucket name no
//! test creates.

use crate::common::{code_and_text, command, conversation};

#[test]
fn a_missing_bucket_is_named_with_the_fix() {
    let endpoint = match std::env::var("DELTAPACK_TEST_S3_ENDPOINT") {
        Ok(e) if !e.is_empty() => e,
        _ => {
            assert!(std::env::var("CI").is_err(), "CI must start the S3 server");
            return;
        }
    };
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    conversation(dir, &[("a", 3, 512)]);
    let store = format!(
        "s3://deltapack-no-such-bucket-{}/p?endpoint={endpoint}",
        std::process::id()
    );
    for json in [false, true] {
        let mut args = vec![
            "publish",
            "--store",
            &store,
            "--identity",
            "id.json",
            "--tokens",
            "a.tok",
            "--snapshot",
            "a.snap",
        ];
        if json {
            args.push("--json");
        }
        let out = command()
            .env("DELTAPACK_STATE_DIR", dir.join("state"))
            .args(&args)
            .current_dir(dir)
            .output()
            .expect("run deltapack");
        let (code, _, err) = code_and_text(&out);
        assert_eq!(code, 1, "{err}");
        if json {
            let e: serde_json::Value = serde_json::from_str(err.trim()).expect("one JSON error");
            let hint = e["error"]["hint"].as_str().unwrap_or_default();
            assert!(hint.contains("bucket does not exist"), "{err}");
        } else {
            assert!(err.contains("hint: the bucket does not exist"), "{err}");
            assert!(err.contains("aws s3 mb"), "{err}");
        }
    }
}
