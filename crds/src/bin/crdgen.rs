//! Writes one YAML file per CRD into `crds/yaml/` (`cargo run -p rollouts-crds --bin crdgen`).

use std::path::Path;
use std::process::ExitCode;

fn main() -> ExitCode {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("yaml");
    match rollouts_crds::crdgen::write_all(&dir) {
        Ok(written) => {
            for path in written {
                println!("wrote {}", path.display());
            }
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("crdgen: {err}");
            ExitCode::FAILURE
        }
    }
}
