//! Writes to the traffic routers: one router brought to the plan's [`TrafficPlan`], in the
//! planner's order. Each router writes only what differs (server-side apply under one field
//! manager, in rollouts-traffic).

use rollouts_traffic::TrafficRouter;

use super::Target;
use crate::error::{Error, Result};
use crate::planner::TrafficPlan;

/// Brings one router to the plan's state, in the planner's order; each call writes only what
/// differs.
pub(super) async fn route(
    target: &Target,
    router: &dyn TrafficRouter,
    traffic: &TrafficPlan,
) -> Result<()> {
    let failed = |operation: &'static str| {
        let namespace = target.namespace.clone();
        let rollout = target.name.clone();
        let router = router.kind().to_string();
        move |source| Error::Traffic {
            operation,
            router,
            namespace,
            rollout,
            source: Box::new(source),
        }
    };
    let mut written = Vec::new();
    if traffic.remove_managed_routes {
        written.extend(
            router
                .remove_managed_routes()
                .await
                .map_err(failed("remove managed routes"))?,
        );
    }
    if !traffic.canary_hash.is_empty() || !traffic.stable_hash.is_empty() {
        written.extend(
            router
                .update_hash(
                    &traffic.canary_hash,
                    &traffic.stable_hash,
                    &traffic.additional,
                )
                .await
                .map_err(failed("update hashes"))?,
        );
    }
    if let Some(route) = &traffic.set_header_route {
        written.extend(
            router
                .set_header_route(route)
                .await
                .map_err(failed("set header route"))?,
        );
    }
    if let Some(route) = &traffic.set_mirror_route {
        written.extend(
            router
                .set_mirror_route(route)
                .await
                .map_err(failed("set mirror route"))?,
        );
    }
    written.extend(
        router
            .set_weight(traffic.desired_weight, &traffic.additional)
            .await
            .map_err(failed("set weight"))?,
    );
    if !written.is_empty() {
        tracing::info!(router = %router.kind(), weight = traffic.desired_weight, ?written, "routed traffic");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Service;
    use kube::ResourceExt;
    use kube::api::{Api, PostParams};
    use rollouts_crds::rollout::{Rollout, RolloutStatus};
    use serde_json::json;

    use super::*;
    use crate::observe::verify_recorded_weight;

    /// The nginx router driven the way a [`TrafficPlan`] asks, on kube-sim: the canary
    /// Ingress gets the weight, and the recorded weight then verifies.
    #[tokio::test]
    async fn a_traffic_plan_sets_the_canary_ingress_weight_and_it_verifies() {
        use k8s_openapi::api::networking::v1::Ingress;
        use kube::api::DynamicObject;
        use kube::discovery::ApiResource;

        let sim = rollouts_e2e::sim::start(rollouts_e2e::sim::SimOptions::default())
            .expect("kube-sim starts");
        let config = kube::Config::new(sim.url().parse().expect("a URI"));
        let client = kube::Client::try_from(config).expect("a client");
        let mut rollout: Rollout = serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Rollout",
            "metadata": {"name": "shop", "namespace": "default", "uid": "uid-shop"},
            "spec": {
                "selector": {"matchLabels": {"app": "shop"}},
                "template": {"metadata": {"labels": {"app": "shop"}}},
                "strategy": {"canary": {
                    "stableService": "shop-stable",
                    "canaryService": "shop-canary",
                    "trafficRouting": {"nginx": {"stableIngress": "shop"}}
                }}
            }
        }))
        .expect("a Rollout");
        let ingress: Ingress = serde_json::from_value(json!({
            "metadata": {"name": "shop", "namespace": "default"},
            "spec": {"rules": [{"host": "shop.example.com", "http": {"paths": [{
                "path": "/", "pathType": "Prefix",
                "backend": {"service": {"name": "shop-stable", "port": {"number": 80}}}
            }]}}]}
        }))
        .expect("an Ingress");
        let ingresses: Api<Ingress> = Api::namespaced(client.clone(), "default");
        ingresses
            .create(&PostParams::default(), &ingress)
            .await
            .expect("creates the stable Ingress");
        let services = ApiResource::erase::<Service>(&());
        for name in ["shop-stable", "shop-canary"] {
            let service = DynamicObject::new(name, &services)
                .within("default")
                .data(json!({"spec": {"ports": [{"port": 80}]}}));
            Api::<DynamicObject>::namespaced_with(client.clone(), "default", &services)
                .create(&PostParams::default(), &service)
                .await
                .expect("creates a Service");
        }
        let target = Target::of(&rollout).expect("a target");
        let routers = rollouts_traffic::routers(client.clone(), &rollout).expect("nginx");
        let traffic = TrafficPlan {
            desired_weight: 25,
            max_traffic_weight: 100,
            additional: Vec::new(),
            canary_hash: "new".into(),
            stable_hash: "old".into(),
            set_header_route: None,
            set_mirror_route: None,
            remove_managed_routes: false,
        };
        for router in &routers {
            route(&target, router.as_ref(), &traffic)
                .await
                .expect("routes");
        }
        let canary = ingresses
            .get(&rollouts_traffic::nginx::canary_ingress_name(
                "shop", "shop",
            ))
            .await
            .expect("the canary Ingress exists");
        let weight = canary
            .annotations()
            .iter()
            .find(|(key, _)| key.ends_with("/canary-weight"))
            .map(|(_, value)| value.clone());
        assert_eq!(weight.as_deref(), Some("25"));

        assert_eq!(
            verify_recorded_weight(&rollout, &routers)
                .await
                .expect("reads"),
            None,
            "no weight recorded yet"
        );
        let mut status = RolloutStatus::default();
        status.canary.weights = Some(rollouts_crds::rollout::TrafficWeights {
            canary: rollouts_crds::rollout::WeightDestination {
                weight: 25,
                ..Default::default()
            },
            ..Default::default()
        });
        rollout.status = Some(status);
        assert_eq!(
            verify_recorded_weight(&rollout, &routers)
                .await
                .expect("reads"),
            Some(true)
        );
    }
}
