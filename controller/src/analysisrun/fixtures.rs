//! Runs for the unit tests of this module.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use rollouts_crds::analysis::{AnalysisRun, AnalysisRunSpec};
use rollouts_crds::rollout::AnalysisRunArgument;

/// `shop/checkout-abc-1`, labelled `app=checkout`, `tier=web`, with `args`.
pub fn run_with_args(args: Vec<AnalysisRunArgument>) -> AnalysisRun {
    AnalysisRun {
        metadata: ObjectMeta {
            name: Some("checkout-abc-1".into()),
            namespace: Some("shop".into()),
            uid: Some("6c1c0a52".into()),
            labels: Some(BTreeMap::from([
                ("app".to_string(), "checkout".to_string()),
                ("tier".to_string(), "web".to_string()),
            ])),
            ..ObjectMeta::default()
        },
        spec: AnalysisRunSpec {
            args,
            ..AnalysisRunSpec::default()
        },
        status: None,
    }
}
