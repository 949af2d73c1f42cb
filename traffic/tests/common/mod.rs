//! Fixture loading shared by the router tests: YAML files under `tests/fixtures/`.

#![allow(dead_code)]

use std::path::PathBuf;

use rollouts_crds::rollout::Rollout;
use serde::de::DeserializeOwned;
use serde_json::Value;

fn read<T: DeserializeOwned>(relative: &str) -> T {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(relative);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|err| panic!("reading {}: {err}", path.display()));
    serde_saphyr::from_str(&text).unwrap_or_else(|err| panic!("parsing {}: {err}", path.display()))
}

/// A router object fixture as JSON.
pub fn object(relative: &str) -> Value {
    read(relative)
}

/// A Rollout fixture.
pub fn rollout(relative: &str) -> Rollout {
    read(relative)
}

/// A step fixture (setHeaderRoute / setMirrorRoute) or any other typed fixture.
pub fn typed<T: DeserializeOwned>(relative: &str) -> T {
    read(relative)
}
