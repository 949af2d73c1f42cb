//! Fixture builders for tests in every crate: a valid canary or blue-green Rollout in one call,
//! adjusted with chained `with_*` methods.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use serde_json::json;

use super::*;

/// Namespace every fixture lives in.
pub const TEST_NAMESPACE: &str = "default";

fn app_labels(name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([("app".to_string(), name.to_string())])
}

fn pod_template(name: &str, image: &str) -> PodTemplate {
    let value = json!({
        "metadata": {"labels": {"app": name}},
        "spec": {"containers": [{"name": name, "image": image}]}
    });
    match value {
        serde_json::Value::Object(map) => PodTemplate(map),
        _ => PodTemplate::default(),
    }
}

fn base(name: &str, strategy: RolloutStrategy) -> Rollout {
    let mut rollout = Rollout::new(
        name,
        RolloutSpec {
            replicas: Some(1),
            selector: Some(LabelSelector {
                match_labels: Some(app_labels(name)),
                ..LabelSelector::default()
            }),
            template: Some(pod_template(name, "nginx:1.27")),
            strategy,
            ..RolloutSpec::default()
        },
    );
    rollout.metadata = ObjectMeta {
        name: Some(name.to_string()),
        namespace: Some(TEST_NAMESPACE.to_string()),
        generation: Some(1),
        ..ObjectMeta::default()
    };
    rollout
}

impl CanaryStep {
    /// `- setWeight: weight`
    pub fn weight(weight: i32) -> Self {
        Self {
            set_weight: Some(weight),
            ..Self::default()
        }
    }

    /// `- pause: {}` (until promoted)
    pub fn pause_indefinitely() -> Self {
        Self {
            pause: Some(RolloutPause::default()),
            ..Self::default()
        }
    }

    /// `- pause: {duration: seconds}`
    pub fn pause_seconds(seconds: i32) -> Self {
        Self {
            pause: Some(RolloutPause {
                duration: Some(IntOrString::Int(seconds)),
            }),
            ..Self::default()
        }
    }

    /// `- setCanaryScale: {replicas: replicas}`
    pub fn canary_scale_replicas(replicas: i32) -> Self {
        Self {
            set_canary_scale: Some(SetCanaryScale {
                replicas: Some(replicas),
                ..SetCanaryScale::default()
            }),
            ..Self::default()
        }
    }

    /// `- analysis: {templates: [{templateName: template}]}`
    pub fn analysis(template: &str) -> Self {
        Self {
            analysis: Some(RolloutAnalysis {
                templates: Some(vec![RolloutAnalysisTemplate {
                    template_name: template.to_string(),
                    cluster_scope: None,
                }]),
                ..RolloutAnalysis::default()
            }),
            ..Self::default()
        }
    }
}

impl Rollout {
    /// A canary Rollout in namespace `default` with one replica, pods labelled `app: <name>`,
    /// image `nginx:1.27`, and the given steps.
    pub fn test_canary(name: &str, steps: Vec<CanaryStep>) -> Self {
        base(
            name,
            RolloutStrategy {
                canary: Some(CanaryStrategy {
                    steps: Some(steps),
                    ..CanaryStrategy::default()
                }),
                blue_green: None,
            },
        )
    }

    /// A blue-green Rollout with services `<name>-active` and `<name>-preview`.
    pub fn test_blue_green(name: &str) -> Self {
        base(
            name,
            RolloutStrategy {
                blue_green: Some(BlueGreenStrategy {
                    active_service: Some(format!("{name}-active")),
                    preview_service: Some(format!("{name}-preview")),
                    ..BlueGreenStrategy::default()
                }),
                canary: None,
            },
        )
    }

    /// Sets `spec.replicas`.
    pub fn with_replicas(mut self, replicas: i32) -> Self {
        self.spec.replicas = Some(replicas);
        self
    }

    /// Replaces the container image (a new revision).
    pub fn with_image(mut self, image: &str) -> Self {
        let name = self.metadata.name.clone().unwrap_or_default();
        self.spec.template = Some(pod_template(&name, image));
        self
    }

    /// Sets `metadata.generation`.
    pub fn with_generation(mut self, generation: i64) -> Self {
        self.metadata.generation = Some(generation);
        self
    }

    /// Sets `spec.paused: true`.
    pub fn paused(mut self) -> Self {
        self.spec.paused = Some(true);
        self
    }

    /// Sets the canary's `canaryService` / `stableService` to `<name>-canary` / `<name>-stable`
    /// and its traffic routing (no-op on a blue-green rollout).
    pub fn with_traffic_routing(mut self, routing: RolloutTrafficRouting) -> Self {
        let name = self.metadata.name.clone().unwrap_or_default();
        if let Some(canary) = self.spec.strategy.canary.as_mut() {
            canary.canary_service = Some(format!("{name}-canary"));
            canary.stable_service = Some(format!("{name}-stable"));
            canary.traffic_routing = Some(routing);
        }
        self
    }

    /// Edits the canary strategy in place (no-op on a blue-green rollout).
    pub fn with_canary(mut self, edit: impl FnOnce(&mut CanaryStrategy)) -> Self {
        if let Some(canary) = self.spec.strategy.canary.as_mut() {
            edit(canary);
        }
        self
    }

    /// Edits the blue-green strategy in place (no-op on a canary rollout).
    pub fn with_blue_green(mut self, edit: impl FnOnce(&mut BlueGreenStrategy)) -> Self {
        if let Some(blue_green) = self.spec.strategy.blue_green.as_mut() {
            edit(blue_green);
        }
        self
    }

    /// Sets the status.
    pub fn with_status(mut self, status: RolloutStatus) -> Self {
        self.status = Some(status);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builders_produce_the_described_rollouts() {
        let rollout = Rollout::test_canary("web", vec![CanaryStep::canary_scale_replicas(2)])
            .with_replicas(3)
            .with_image("nginx:1.28")
            .with_generation(4)
            .paused()
            .with_canary(|c| c.max_surge = Some(IntOrString::Int(1)));
        assert_eq!(rollout.metadata.namespace.as_deref(), Some(TEST_NAMESPACE));
        assert_eq!(rollout.spec.replicas, Some(3));
        assert_eq!(rollout.metadata.generation, Some(4));
        assert!(rollout.spec.is_paused());
        let canary = rollout.canary().expect("canary");
        assert_eq!(canary.max_surge, Some(IntOrString::Int(1)));
        assert_eq!(
            canary.steps()[0]
                .set_canary_scale
                .as_ref()
                .and_then(|s| s.replicas),
            Some(2)
        );
        let template = rollout
            .spec
            .template
            .as_ref()
            .expect("template")
            .to_spec()
            .expect("typed");
        let image = template.spec.expect("pod spec").containers[0].image.clone();
        assert_eq!(image.as_deref(), Some("nginx:1.28"));

        let blue_green = Rollout::test_blue_green("web")
            .with_blue_green(|b| b.auto_promotion_enabled = Some(false));
        assert!(
            !blue_green
                .blue_green()
                .expect("blue-green")
                .effective_auto_promotion_enabled()
        );
    }
}
