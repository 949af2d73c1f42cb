use super::*;

const WEIGHTS: [i32; 11] = [0, 1, 5, 10, 20, 25, 33, 50, 75, 99, 100];

/// (replicas, maxSurge, expected (canary, stable) per weight of WEIGHTS).
type MatrixRow = (i32, i32, [(i32, i32); 11]);

fn counts(canary: i32, stable: i32) -> CanaryStableCounts {
    CanaryStableCounts { canary, stable }
}

fn rs(replicas: i32, available: i32) -> Option<ReplicaSetCount> {
    Some(ReplicaSetCount {
        replicas,
        available,
    })
}

fn fence(max_surge: i32, max_unavailable: i32) -> Fenceposts {
    Fenceposts {
        max_surge,
        max_unavailable,
    }
}

fn percent(value: i32) -> IntOrString {
    IntOrString::String(format!("{value}%"))
}

#[test]
fn approximation_matches_argo_table() {
    // (replicas, weight, maxSurge, canary, stable) from Argo's TestApproximateWeightedNewStableReplicaCounts.
    let cases = [
        (0, 0, 0, 0, 0),
        (0, 50, 0, 0, 0),
        (0, 100, 1, 0, 0),
        (1, 0, 0, 0, 1),
        (1, 1, 0, 0, 1),
        (1, 49, 0, 0, 1),
        (1, 50, 0, 1, 0),
        (1, 99, 0, 1, 0),
        (1, 100, 0, 1, 0),
        (1, 0, 1, 0, 1),
        (1, 1, 1, 1, 1),
        (1, 49, 1, 1, 1),
        (1, 50, 1, 1, 1),
        (1, 99, 1, 1, 1),
        (1, 100, 1, 1, 0),
        (2, 0, 0, 0, 2),
        (2, 1, 0, 1, 1),
        (2, 50, 0, 1, 1),
        (2, 99, 0, 1, 1),
        (2, 100, 0, 2, 0),
        (2, 0, 1, 0, 2),
        (2, 1, 1, 1, 2),
        (2, 50, 1, 1, 1),
        (2, 99, 1, 2, 1),
        (2, 100, 1, 2, 0),
        (3, 10, 0, 1, 2),
        (3, 25, 0, 1, 2),
        (3, 33, 0, 1, 2),
        (3, 34, 0, 1, 2),
        (3, 49, 0, 1, 2),
        (3, 50, 0, 2, 1),
        (3, 10, 1, 1, 3),
        (3, 25, 1, 1, 3),
        (3, 33, 1, 1, 2),
        (3, 34, 1, 1, 2),
        (3, 49, 1, 2, 2),
        (3, 50, 1, 2, 2),
        (10, 0, 1, 0, 10),
        (10, 1, 0, 1, 9),
        (10, 14, 0, 1, 9),
        (10, 15, 0, 2, 8),
        (10, 16, 0, 2, 8),
        (10, 99, 0, 9, 1),
        (10, 100, 1, 10, 0),
        (10, 1, 1, 1, 10),
        (10, 18, 1, 2, 9),
        (10, 19, 1, 2, 9),
        (10, 20, 1, 2, 8),
        (10, 23, 1, 2, 8),
        (10, 24, 1, 3, 8),
        (10, 25, 1, 3, 8),
        (10, 99, 1, 10, 1),
    ];
    for (replicas, weight, surge, canary, stable) in cases {
        assert_eq!(
            approximate_weighted_canary_stable_replica_counts(replicas, weight, MAX_WEIGHT, surge),
            counts(canary, stable),
            "replicas {replicas}, weight {weight}, maxSurge {surge}"
        );
    }
}

#[test]
fn approximation_matrix_for_odd_replica_counts() {
    // Rows: (replicas, maxSurge) -> (canary, stable) per weight of WEIGHTS, worked out from
    // Argo's candidate rule: ceil and floor of the weighted count over replicas and replicas + 1.
    let table: [MatrixRow; 8] = [
        (
            1,
            0,
            [
                (0, 1),
                (0, 1),
                (0, 1),
                (0, 1),
                (0, 1),
                (0, 1),
                (0, 1),
                (1, 0),
                (1, 0),
                (1, 0),
                (1, 0),
            ],
        ),
        (
            1,
            1,
            [
                (0, 1),
                (1, 1),
                (1, 1),
                (1, 1),
                (1, 1),
                (1, 1),
                (1, 1),
                (1, 1),
                (1, 1),
                (1, 1),
                (1, 0),
            ],
        ),
        (
            3,
            0,
            [
                (0, 3),
                (1, 2),
                (1, 2),
                (1, 2),
                (1, 2),
                (1, 2),
                (1, 2),
                (2, 1),
                (2, 1),
                (2, 1),
                (3, 0),
            ],
        ),
        (
            3,
            1,
            [
                (0, 3),
                (1, 3),
                (1, 3),
                (1, 3),
                (1, 3),
                (1, 3),
                (1, 2),
                (2, 2),
                (3, 1),
                (3, 1),
                (3, 0),
            ],
        ),
        (
            4,
            0,
            [
                (0, 4),
                (1, 3),
                (1, 3),
                (1, 3),
                (1, 3),
                (1, 3),
                (1, 3),
                (2, 2),
                (3, 1),
                (3, 1),
                (4, 0),
            ],
        ),
        (
            4,
            1,
            [
                (0, 4),
                (1, 4),
                (1, 4),
                (1, 4),
                (1, 4),
                (1, 3),
                (2, 3),
                (2, 2),
                (3, 1),
                (4, 1),
                (4, 0),
            ],
        ),
        (
            10,
            0,
            [
                (0, 10),
                (1, 9),
                (1, 9),
                (1, 9),
                (2, 8),
                (3, 7),
                (3, 7),
                (5, 5),
                (8, 2),
                (9, 1),
                (10, 0),
            ],
        ),
        (
            10,
            1,
            [
                (0, 10),
                (1, 10),
                (1, 10),
                (1, 9),
                (2, 8),
                (3, 8),
                (3, 7),
                (5, 5),
                (8, 3),
                (10, 1),
                (10, 0),
            ],
        ),
    ];
    for (replicas, surge, expected) in table {
        for (weight, (canary, stable)) in WEIGHTS.into_iter().zip(expected) {
            let got = approximate_weighted_canary_stable_replica_counts(
                replicas, weight, MAX_WEIGHT, surge,
            );
            assert_eq!(
                got,
                counts(canary, stable),
                "replicas {replicas}, weight {weight}, maxSurge {surge}"
            );
            let total = got.canary + got.stable;
            assert!(total == replicas || (surge > 0 && total == replicas + 1));
            if weight == 0 {
                assert_eq!(got.canary, 0);
            }
            if weight == 100 {
                assert_eq!(got, counts(replicas, 0));
            }
            // Only a single pod without surge may leave a 1..99 weight with an empty side.
            if (1..100).contains(&weight) && !(replicas == 1 && surge == 0) {
                assert!(
                    got.canary > 0 && got.stable > 0,
                    "weight {weight} of {replicas}"
                );
            }
        }
    }
}

#[test]
fn basic_canary_matches_argo_cases() {
    // (replicas, weight, surge, unavailable, stable rs, canary rs, older replicas, expected)
    // from Argo's TestCalculateReplicaCountsForCanary (cases without a traffic router).
    let cases = [
        (10, 100, 3, 0, (7, 8), (6, 3), 0, counts(6, 7)),
        (10, 20, 2, 0, (10, 10), (0, 0), 0, counts(2, 10)),
        (10, 20, 2, 0, (10, 10), (2, 2), 0, counts(2, 8)),
        (10, 30, 2, 0, (10, 10), (0, 0), 0, counts(2, 10)),
        (10, 20, 0, 2, (10, 10), (0, 0), 0, counts(0, 8)),
        (10, 30, 0, 2, (10, 10), (0, 0), 0, counts(0, 8)),
        (10, 50, 2, 1, (10, 10), (0, 0), 0, counts(2, 9)),
        (10, 0, 1, 1, (10, 10), (1, 1), 0, counts(0, 10)),
        (10, 100, 1, 1, (1, 1), (10, 10), 0, counts(10, 0)),
        (1, 20, 1, 0, (1, 1), (0, 0), 0, counts(1, 1)),
        (1, 90, 1, 0, (1, 1), (0, 0), 0, counts(1, 1)),
        (1, 49, 0, 1, (1, 1), (0, 0), 0, counts(0, 1)),
        (1, 51, 0, 1, (1, 1), (0, 0), 0, counts(0, 0)),
        (1, 51, 0, 1, (0, 0), (0, 0), 0, counts(1, 0)),
        (10, 30, 1, 0, (1, 1), (0, 0), 3, counts(1, 7)),
        (10, 30, 0, 3, (8, 5), (4, 4), 0, counts(3, 7)),
        (10, 100, 1, 0, (10, 2), (10, 8), 0, counts(9, 2)),
        (10, 30, 0, 1, (8, 6), (4, 2), 3, counts(4, 8)),
        (10, 5, 0, 1, (10, 10), (0, 0), 0, counts(0, 9)),
        (10, 5, 0, 1, (9, 9), (0, 0), 0, counts(1, 9)),
        (4, 100, 1, 0, (4, 1), (0, 0), 0, counts(1, 4)),
        (3, 99, 0, 2, (3, 3), (0, 0), 0, counts(0, 1)),
        (3, 99, 0, 2, (1, 1), (0, 0), 0, counts(2, 1)),
        (4, 100, 1, 0, (4, 1), (1, 1), 0, counts(1, 3)),
        (4, 0, 1, 0, (0, 0), (4, 4), 0, counts(4, 1)),
        (4, 0, 1, 0, (1, 0), (4, 4), 0, counts(4, 1)),
        (4, 0, 1, 0, (1, 1), (4, 4), 0, counts(3, 1)),
    ];
    for (replicas, weight, surge, unavailable, stable, canary, older, expected) in cases {
        let inputs = BasicCanaryInputs {
            spec_replicas: replicas,
            desired_weight: weight,
            fenceposts: fence(surge, unavailable),
            canary: rs(canary.0, canary.1),
            stable: rs(stable.0, stable.1),
            older_replicas: older,
        };
        assert_eq!(
            calculate_replica_counts_for_canary(inputs),
            expected,
            "{inputs:?}"
        );
    }
}

#[test]
fn both_fenceposts_zero_still_moves_one_pod() {
    let fenceposts = resolve_fenceposts(Some(&percent(0)), Some(&percent(0)), 10).unwrap();
    assert_eq!(fenceposts, fence(0, 1));
    let inputs = BasicCanaryInputs {
        spec_replicas: 10,
        desired_weight: 10,
        fenceposts,
        canary: rs(0, 0),
        stable: rs(10, 10),
        older_replicas: 0,
    };
    assert_eq!(calculate_replica_counts_for_canary(inputs), counts(0, 9));
}

#[test]
fn without_a_distinct_stable_the_canary_takes_every_replica() {
    let inputs = BasicCanaryInputs {
        spec_replicas: 10,
        desired_weight: 10,
        fenceposts: fence(0, 1),
        canary: rs(9, 9),
        stable: None,
        older_replicas: 0,
    };
    assert_eq!(calculate_replica_counts_for_canary(inputs), counts(10, 0));
}

#[test]
fn first_move_with_default_fenceposts() {
    // From a fully available stable and an empty canary, 25% surge / 25% unavailable.
    let table: [(i32, [(i32, i32); 11]); 4] = [
        (
            1,
            [
                (0, 1),
                (1, 1),
                (1, 1),
                (1, 1),
                (1, 1),
                (1, 1),
                (1, 1),
                (1, 1),
                (1, 1),
                (1, 1),
                (1, 1),
            ],
        ),
        (
            3,
            [
                (0, 3),
                (1, 3),
                (1, 3),
                (1, 3),
                (1, 3),
                (1, 3),
                (1, 3),
                (1, 3),
                (1, 3),
                (1, 3),
                (1, 3),
            ],
        ),
        (
            4,
            [
                (0, 4),
                (1, 4),
                (1, 4),
                (1, 4),
                (1, 4),
                (1, 3),
                (1, 3),
                (1, 3),
                (1, 3),
                (1, 3),
                (1, 3),
            ],
        ),
        (
            10,
            [
                (0, 10),
                (1, 10),
                (1, 10),
                (1, 9),
                (2, 8),
                (3, 8),
                (3, 8),
                (3, 8),
                (3, 8),
                (3, 8),
                (3, 8),
            ],
        ),
    ];
    for (replicas, expected) in table {
        let fenceposts = resolve_fenceposts(None, None, replicas).unwrap();
        for (weight, (canary, stable)) in WEIGHTS.into_iter().zip(expected) {
            let inputs = BasicCanaryInputs {
                spec_replicas: replicas,
                desired_weight: weight,
                fenceposts,
                canary: rs(0, 0),
                stable: rs(replicas, replicas),
                older_replicas: 0,
            };
            assert_eq!(
                calculate_replica_counts_for_canary(inputs),
                counts(canary, stable),
                "replicas {replicas}, weight {weight}"
            );
        }
    }
}

/// Applies the counts repeatedly, pods becoming available at once, until nothing changes.
/// Checks maxSurge and maxUnavailable on every move.
fn settle(
    replicas: i32,
    weight: i32,
    fenceposts: Fenceposts,
    start: (i32, i32),
) -> CanaryStableCounts {
    let mut current = counts(start.0, start.1);
    for _ in 0..(4 * replicas + 8) {
        let next = calculate_replica_counts_for_canary(BasicCanaryInputs {
            spec_replicas: replicas,
            desired_weight: weight,
            fenceposts,
            canary: rs(current.canary, current.canary),
            stable: rs(current.stable, current.stable),
            older_replicas: 0,
        });
        assert!(
            next.canary + next.stable <= replicas + fenceposts.max_surge,
            "surge exceeded moving {current:?} -> {next:?} (replicas {replicas}, weight {weight})"
        );
        let still_available = next.canary.min(current.canary) + next.stable.min(current.stable);
        assert!(
            still_available
                >= (replicas - fenceposts.max_unavailable).min(current.canary + current.stable),
            "too many unavailable moving {current:?} -> {next:?} (replicas {replicas}, weight {weight})"
        );
        if next == current {
            return current;
        }
        current = next;
    }
    panic!("replicas {replicas}, weight {weight}: counts never settled, last {current:?}");
}

#[test]
fn rollout_forward_settles_on_the_approximation() {
    for replicas in [1, 3, 4, 10] {
        let fenceposts = resolve_fenceposts(None, None, replicas).unwrap();
        for weight in WEIGHTS {
            let settled = settle(replicas, weight, fenceposts, (0, replicas));
            let target = approximate_weighted_canary_stable_replica_counts(
                replicas,
                weight,
                MAX_WEIGHT,
                fenceposts.max_surge,
            );
            assert_eq!(settled, target, "replicas {replicas}, weight {weight}");
        }
    }
}

#[test]
fn abort_settles_back_on_stable() {
    for replicas in [1, 3, 4, 10] {
        for fenceposts in [
            fence(1, 0),
            fence(0, 1),
            resolve_fenceposts(None, None, replicas).unwrap(),
        ] {
            let settled = settle(replicas, 0, fenceposts, (replicas, 0));
            assert_eq!(
                settled,
                counts(0, replicas),
                "replicas {replicas}, {fenceposts:?}"
            );
        }
    }
}

#[test]
fn fenceposts_resolve_like_kubernetes() {
    // maxSurge rounds up, maxUnavailable rounds down.
    assert_eq!(resolve_fenceposts(None, None, 1).unwrap(), fence(1, 0));
    assert_eq!(resolve_fenceposts(None, None, 3).unwrap(), fence(1, 0));
    assert_eq!(resolve_fenceposts(None, None, 4).unwrap(), fence(1, 1));
    assert_eq!(resolve_fenceposts(None, None, 10).unwrap(), fence(3, 2));
    assert_eq!(
        resolve_fenceposts(Some(&percent(20)), Some(&IntOrString::Int(0)), 10).unwrap(),
        fence(2, 0)
    );
    assert_eq!(
        resolve_fenceposts(Some(&IntOrString::Int(0)), Some(&percent(20)), 10).unwrap(),
        fence(0, 2)
    );
    // maxUnavailable is capped at spec.replicas, and both-zero falls back to one unavailable.
    assert_eq!(
        resolve_fenceposts(Some(&IntOrString::Int(0)), Some(&IntOrString::Int(7)), 3).unwrap(),
        fence(0, 3)
    );
    assert_eq!(
        resolve_fenceposts(Some(&IntOrString::Int(0)), Some(&IntOrString::Int(0)), 0).unwrap(),
        fence(0, 0)
    );
}

#[test]
fn a_malformed_fencepost_names_the_field_and_the_fix() {
    let error = resolve_fenceposts(Some(&IntOrString::String("lots".into())), None, 4).unwrap_err();
    assert_eq!(error.path, "spec.strategy.canary.maxSurge");
    assert!(error.reason.contains("lots"));
    assert!(error.fix.contains("25%"));
    let error = resolve_fenceposts(None, Some(&IntOrString::Int(-1)), 4).unwrap_err();
    assert_eq!(error.path, "spec.strategy.canary.maxUnavailable");
}

#[test]
fn traffic_routed_counts_match_argo_cases() {
    let base = TrafficRoutedInputs {
        spec_replicas: 10,
        canary_scale: CanaryScale::Weight(10),
        max_weight: MAX_WEIGHT,
        min_pods_per_replica_set: None,
        dynamic_stable_scale: false,
        current_weights: None,
        aborted: false,
    };
    let routed = calculate_replica_counts_for_traffic_routed_canary;
    assert_eq!(routed(base), counts(1, 10));
    // setCanaryScale.replicas wins over the weight; setCanaryScale.weight may exceed 100.
    assert_eq!(
        routed(TrafficRoutedInputs {
            spec_replicas: 1,
            canary_scale: CanaryScale::Replicas(9),
            ..base
        }),
        counts(9, 1)
    );
    assert_eq!(
        routed(TrafficRoutedInputs {
            spec_replicas: 4,
            canary_scale: CanaryScale::Weight(200),
            ..base
        }),
        counts(8, 4)
    );
    // minPodsPerReplicaSet, capped at spec.replicas.
    assert_eq!(
        routed(TrafficRoutedInputs {
            canary_scale: CanaryScale::Weight(5),
            min_pods_per_replica_set: Some(2),
            ..base
        }),
        counts(2, 10)
    );
    assert_eq!(
        routed(TrafficRoutedInputs {
            spec_replicas: 1,
            canary_scale: CanaryScale::Weight(100),
            min_pods_per_replica_set: Some(2),
            ..base
        }),
        counts(1, 1)
    );
    // dynamicStableScale: stable keeps pods for the traffic it has, canary on abort too.
    let dynamic = TrafficRoutedInputs {
        dynamic_stable_scale: true,
        current_weights: Some((10, 90)),
        ..base
    };
    assert_eq!(routed(dynamic), counts(1, 9));
    assert_eq!(
        routed(TrafficRoutedInputs {
            canary_scale: CanaryScale::Weight(20),
            ..dynamic
        }),
        counts(2, 9)
    );
    assert_eq!(
        routed(TrafficRoutedInputs {
            canary_scale: CanaryScale::Weight(0),
            current_weights: Some((20, 80)),
            aborted: true,
            ..dynamic
        }),
        counts(2, 10)
    );
    assert_eq!(
        routed(TrafficRoutedInputs {
            canary_scale: CanaryScale::Weight(0),
            aborted: true,
            ..dynamic
        }),
        counts(1, 10)
    );
}

#[test]
fn traffic_weight_rounds_up() {
    assert_eq!(traffic_weight_to_replicas(10, 0, 100), 0);
    assert_eq!(traffic_weight_to_replicas(10, 20, 100), 2);
    assert_eq!(traffic_weight_to_replicas(10, 25, 100), 3);
    assert_eq!(traffic_weight_to_replicas(10, 33, 100), 4);
    assert_eq!(traffic_weight_to_replicas(10, 99, 100), 10);
    assert_eq!(traffic_weight_to_replicas(23, 100_000_000, 100_000_000), 23);
}

#[test]
fn min_pods_never_lifts_zero() {
    assert_eq!(min_pods_per_replica_set(0, Some(3), 10), 0);
    assert_eq!(min_pods_per_replica_set(1, Some(3), 10), 3);
    assert_eq!(min_pods_per_replica_set(5, Some(3), 10), 5);
    assert_eq!(min_pods_per_replica_set(1, Some(3), 2), 2);
    assert_eq!(min_pods_per_replica_set(1, None, 10), 1);
}

#[test]
fn actual_weight_is_what_the_pods_give() {
    assert_eq!(actual_weight(0, 0), 0);
    assert_eq!(actual_weight(0, 4), 0);
    assert_eq!(actual_weight(1, 4), 25);
    assert_eq!(actual_weight(1, 5), 20);
    assert_eq!(actual_weight(1, 3), 33);
    assert_eq!(actual_weight(2, 3), 67);
    assert_eq!(actual_weight(1, 8), 13);
    assert_eq!(actual_weight(4, 4), 100);
    assert_eq!(actual_weight(5, 4), 100);
    // 5% asked of 4 pods: the best the approximation can do is 1 canary of 5 (20%).
    let approx = approximate_weighted_canary_stable_replica_counts(4, 5, MAX_WEIGHT, 1);
    assert_eq!(
        actual_weight(approx.canary, approx.canary + approx.stable),
        20
    );
}

#[test]
fn absurd_observed_counts_saturate() {
    let inputs = BasicCanaryInputs {
        spec_replicas: i32::MAX,
        desired_weight: 50,
        fenceposts: fence(i32::MAX, i32::MAX),
        canary: rs(i32::MAX, i32::MIN),
        stable: rs(i32::MIN, i32::MAX),
        older_replicas: i32::MAX,
    };
    let _ = calculate_replica_counts_for_canary(inputs);
    assert_eq!(sum_counts([i32::MAX, i32::MAX, 1]), i32::MAX);
    assert_eq!(traffic_weight_to_replicas(i32::MAX, i32::MAX, 1), i32::MAX);
    assert!(
        resolve_int_or_percent(
            &IntOrString::String("9223372036854775807%".into()),
            10,
            true,
            "spec.strategy.canary.maxSurge",
        )
        .is_err()
    );
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    fn count() -> impl Strategy<Value = i32> {
        prop_oneof![0..50i32, any::<i32>()]
    }

    fn replica_set() -> impl Strategy<Value = Option<ReplicaSetCount>> {
        proptest::option::of(
            (count(), count()).prop_map(|(replicas, available)| ReplicaSetCount {
                replicas,
                available,
            }),
        )
    }

    fn int_or_percent() -> impl Strategy<Value = IntOrString> {
        prop_oneof![
            any::<i32>().prop_map(IntOrString::Int),
            any::<i64>().prop_map(|n| IntOrString::String(format!("{n}%"))),
            (0..200i32).prop_map(|n| IntOrString::String(format!("{n}%"))),
            "\\PC{0,8}".prop_map(IntOrString::String),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        #[test]
        fn fenceposts_resolve_or_err(
            surge in proptest::option::of(int_or_percent()),
            unavailable in proptest::option::of(int_or_percent()),
            replicas in count(),
        ) {
            if let Ok(f) = resolve_fenceposts(surge.as_ref(), unavailable.as_ref(), replicas) {
                prop_assert!(f.max_surge >= 0 && f.max_unavailable >= 0);
            }
        }

        #[test]
        fn basic_canary_counts_never_panic(
            spec_replicas in count(),
            desired_weight in prop_oneof![0..=100i32, any::<i32>()],
            fenceposts in (count(), count()).prop_map(|(s, u)| fence(s, u)),
            canary in replica_set(),
            stable in replica_set(),
            older_replicas in count(),
        ) {
            let _ = calculate_replica_counts_for_canary(BasicCanaryInputs {
                spec_replicas,
                desired_weight,
                fenceposts,
                canary,
                stable,
                older_replicas,
            });
        }

        /// Within the bounds validation enforces, the counts stay within what was asked.
        #[test]
        fn basic_canary_counts_in_bounds_are_sane(
            spec_replicas in 0..1000i32,
            desired_weight in 0..=100i32,
            surge in 0..100i32,
            unavailable in 0..100i32,
        ) {
            let fenceposts = resolve_fenceposts(
                Some(&IntOrString::Int(surge)),
                Some(&IntOrString::Int(unavailable)),
                spec_replicas,
            ).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let counts = approximate_weighted_canary_stable_replica_counts(
                spec_replicas,
                desired_weight,
                MAX_WEIGHT,
                fenceposts.max_surge,
            );
            prop_assert!(counts.canary >= 0 && counts.stable >= 0);
            prop_assert!(counts.canary + counts.stable <= spec_replicas + 1);
        }

        #[test]
        fn routed_counts_never_panic(
            spec_replicas in count(),
            scale in prop_oneof![
                count().prop_map(CanaryScale::Weight),
                count().prop_map(CanaryScale::Replicas),
            ],
            max_weight in prop_oneof![Just(100), any::<i32>()],
            min_pods in proptest::option::of(count()),
            dynamic_stable_scale in any::<bool>(),
            current_weights in proptest::option::of((count(), count())),
            aborted in any::<bool>(),
        ) {
            let _ = calculate_replica_counts_for_traffic_routed_canary(TrafficRoutedInputs {
                spec_replicas,
                canary_scale: scale,
                max_weight,
                min_pods_per_replica_set: min_pods,
                dynamic_stable_scale,
                current_weights,
                aborted,
            });
        }

        #[test]
        fn weights_and_sums_never_panic(
            a in any::<i32>(),
            b in any::<i32>(),
            c in any::<i32>(),
            counts in proptest::collection::vec(any::<i32>(), 0..8),
        ) {
            let _ = traffic_weight_to_replicas(a, b, c);
            let _ = min_pods_per_replica_set(a, Some(b), c);
            let weight = actual_weight(a, b);
            prop_assert!((0..=MAX_WEIGHT).contains(&weight));
            let _ = sum_counts(counts);
        }
    }
}
