//! The judge's configuration, early exits, classification gates, errors and the JSON a
//! successCondition reads.

use rollouts_analysis::judge::{
    Direction, JudgeConfig, JudgeError, NoDataPhase, NoDataPolicy, Side, Verdict, judge,
    no_data_outcome,
};
use serde_json::json;

/// Twenty samples spread evenly over [centre - 1, centre + 1].
fn spread(centre: f64) -> Vec<f64> {
    (0..20).map(|i| centre - 1.0 + i as f64 / 9.5).collect()
}

#[test]
fn config_reads_the_yaml_names_and_fills_defaults() {
    let cfg: JudgeConfig = serde_json::from_value(json!({
        "direction": "increase",
        "confidence": 0.95,
        "allowedIncrease": 1.2,
        "allowedDecrease": 0.8,
        "minSamples": 8,
        "noData": "fail",
    }))
    .unwrap();
    assert_eq!(cfg.direction, Direction::Increase);
    assert_eq!(cfg.confidence, 0.95);
    assert_eq!(cfg.allowed_increase, 1.2);
    assert_eq!(cfg.allowed_decrease, 0.8);
    assert_eq!(cfg.min_samples, 8);
    assert_eq!(cfg.no_data, NoDataPolicy::Fail);
    assert_eq!(cfg.remove_outliers, JudgeConfig::default().remove_outliers);

    let empty: JudgeConfig = serde_json::from_value(json!({})).unwrap();
    assert_eq!(empty, JudgeConfig::default());
    let written = serde_json::to_value(JudgeConfig::default()).unwrap();
    assert_eq!(written["nanHandling"], "drop");
    assert_eq!(written["removeOutliers"], false);
    assert_eq!(written["noData"], "inconclusive");
}

#[test]
fn invalid_config_names_the_field_and_the_fix() {
    let cases = [
        (
            JudgeConfig {
                confidence: 1.5,
                ..JudgeConfig::default()
            },
            "confidence",
        ),
        (
            JudgeConfig {
                allowed_increase: -1.0,
                ..JudgeConfig::default()
            },
            "allowedIncrease",
        ),
        (
            JudgeConfig {
                allowed_decrease: f64::NAN,
                ..JudgeConfig::default()
            },
            "allowedDecrease",
        ),
        (
            JudgeConfig {
                min_samples: 0,
                ..JudgeConfig::default()
            },
            "minSamples",
        ),
    ];
    for (cfg, field) in cases {
        let err = judge(&spread(1.0), &spread(1.0), &cfg).unwrap_err();
        assert!(
            matches!(&err, JudgeError::InvalidConfig { field: f, .. } if *f == field),
            "{err}"
        );
        let message = err.to_string();
        assert!(
            message.contains(field) && message.contains("use "),
            "{message}"
        );
    }
}

#[test]
fn outcome_serialises_to_the_measurement_object() {
    let outcome = judge(&spread(20.0), &spread(10.0), &JudgeConfig::default()).unwrap();
    assert_eq!(outcome.verdict, Verdict::High);
    let value = serde_json::to_value(&outcome).unwrap();
    assert_eq!(value["verdict"], "High");
    assert_eq!(value["canarySamples"], 20);
    assert_eq!(value["baselineSamples"], 20);
    assert!((value["meanRatio"].as_f64().unwrap() - 2.0).abs() < 1e-12);
    assert!((value["canaryMean"].as_f64().unwrap() - 20.0).abs() < 1e-12);
    assert!((value["baselineMean"].as_f64().unwrap() - 10.0).abs() < 1e-12);
    let (lower, shift, upper) = (
        value["lower"].as_f64().unwrap(),
        value["shift"].as_f64().unwrap(),
        value["upper"].as_f64().unwrap(),
    );
    assert!(lower <= shift && shift <= upper && lower > 0.0);
    assert!((shift - 10.0).abs() < 0.01, "shift {shift}");
    assert!(value["reason"].as_str().is_some_and(|r| !r.is_empty()));
    let back: rollouts_analysis::judge::JudgeOutcome = serde_json::from_value(value).unwrap();
    assert_eq!(back, outcome);
}

#[test]
fn undefined_numbers_serialise_as_null() {
    // The baseline's mean is 0: the ratio is undefined, and does not veto the High.
    let centred: Vec<f64> = (1..=10)
        .flat_map(|k| [k as f64 * 0.25, -(k as f64) * 0.25])
        .collect();
    let outcome = judge(&spread(5.0), &centred, &JudgeConfig::default()).unwrap();
    assert_eq!(outcome.baseline_mean, Some(0.0));
    assert_eq!(outcome.verdict, Verdict::High);
    let value = serde_json::to_value(&outcome).unwrap();
    assert!(value["meanRatio"].is_null());

    // A canary at 0 over a non-zero baseline is a ratio of 0, not undefined.
    let quiet = judge(&[0.0; 20], &spread(5.0), &JudgeConfig::default()).unwrap();
    assert_eq!(quiet.mean_ratio, Some(0.0));
    assert_eq!(quiet.verdict, Verdict::Low);

    let no_data =
        serde_json::to_value(judge(&[], &spread(1.0), &JudgeConfig::default()).unwrap()).unwrap();
    assert_eq!(no_data["verdict"], "NoData");
    for field in ["canaryMean", "meanRatio", "shift", "lower", "upper"] {
        assert!(no_data[field].is_null(), "{field} is {}", no_data[field]);
    }
    assert!((no_data["baselineMean"].as_f64().unwrap() - 1.0).abs() < 1e-12);
}

#[test]
fn too_few_samples_is_no_data_and_the_policy_decides() {
    let cfg = JudgeConfig {
        min_samples: 8,
        ..JudgeConfig::default()
    };
    let outcome = judge(&spread(5.0)[..7], &spread(1.0), &cfg).unwrap();
    assert_eq!(outcome.verdict, Verdict::NoData);
    assert!(
        outcome.reason.contains("minSamples 8"),
        "{}",
        outcome.reason
    );
    assert_eq!(
        outcome.no_data_phase(NoDataPolicy::Pass),
        Some(NoDataPhase::Successful)
    );
    assert_eq!(
        outcome.no_data_phase(NoDataPolicy::Inconclusive),
        Some(NoDataPhase::Inconclusive)
    );
    assert_eq!(
        outcome.no_data_phase(NoDataPolicy::Fail),
        Some(NoDataPhase::Failed)
    );
    assert_eq!(no_data_outcome(NoDataPolicy::Fail), NoDataPhase::Failed);

    let enough = judge(&spread(5.0)[..8], &spread(1.0), &cfg).unwrap();
    assert_eq!(enough.verdict, Verdict::High);
    assert_eq!(enough.no_data_phase(NoDataPolicy::Fail), None);
}

#[test]
fn direction_limits_what_is_reported() {
    let up = (spread(20.0), spread(10.0));
    let down = (spread(10.0), spread(20.0));
    let with = |direction| JudgeConfig {
        direction,
        ..JudgeConfig::default()
    };
    let verdict =
        |(c, b): &(Vec<f64>, Vec<f64>), cfg: &JudgeConfig| judge(c, b, cfg).unwrap().verdict;
    assert_eq!(verdict(&up, &with(Direction::Increase)), Verdict::High);
    assert_eq!(verdict(&down, &with(Direction::Increase)), Verdict::Pass);
    assert_eq!(verdict(&up, &with(Direction::Decrease)), Verdict::Pass);
    assert_eq!(verdict(&down, &with(Direction::Decrease)), Verdict::Low);
    assert_eq!(verdict(&up, &with(Direction::Either)), Verdict::High);
    assert_eq!(verdict(&down, &with(Direction::Either)), Verdict::Low);
}

#[test]
fn mean_ratio_gates_a_significant_shift() {
    // Canary about 10% above the baseline: significant, but below allowedIncrease 1.2.
    let canary = spread(11.0);
    let baseline = spread(10.0);
    let strict = JudgeConfig {
        allowed_increase: 1.2,
        ..JudgeConfig::default()
    };
    let gated = judge(&canary, &baseline, &strict).unwrap();
    assert_eq!(gated.verdict, Verdict::Pass, "{}", gated.reason);
    assert!(gated.lower.unwrap() > 0.25 * gated.shift.unwrap());
    let loose = judge(&canary, &baseline, &JudgeConfig::default()).unwrap();
    assert_eq!(loose.verdict, Verdict::High, "{}", loose.reason);

    let lenient_low = JudgeConfig {
        allowed_decrease: 0.5,
        ..JudgeConfig::default()
    };
    assert_eq!(
        judge(&baseline, &canary, &lenient_low).unwrap().verdict,
        Verdict::Pass
    );
}

#[test]
fn small_shift_within_a_quarter_of_the_estimate_passes() {
    // Wide, overlapping samples: the interval's lower end stays below 0.25 x the estimate.
    let canary: Vec<f64> = (0..20).map(|i| 10.3 + (i as f64 - 9.5) * 0.6).collect();
    let baseline: Vec<f64> = (0..20).map(|i| 10.0 + (i as f64 - 9.5) * 0.6).collect();
    let outcome = judge(&canary, &baseline, &JudgeConfig::default()).unwrap();
    assert_eq!(outcome.verdict, Verdict::Pass, "{}", outcome.reason);
    assert!(outcome.lower.unwrap() < 0.0 && outcome.upper.unwrap() > 0.0);
}

#[test]
fn constant_sides_get_reproducible_noise() {
    let cfg = JudgeConfig::default();
    let first = judge(&[2.0; 10], &[1.0; 10], &cfg).unwrap();
    assert_eq!(first.verdict, Verdict::High, "{}", first.reason);
    assert_eq!(first, judge(&[2.0; 10], &[1.0; 10], &cfg).unwrap());
    // Means come from the samples as given, not the noise.
    assert_eq!(first.mean_ratio, Some(2.0));
    let reseeded = judge(&[2.0; 10], &[1.0; 10], &JudgeConfig { seed: 7, ..cfg }).unwrap();
    assert_eq!(reseeded.verdict, Verdict::High);
    assert_ne!(
        reseeded.lower, first.lower,
        "another seed draws other noise"
    );

    // A side at exactly 0 gets no noise; the other side's noise is enough.
    let zero = judge(&[0.0; 10], &[0.01; 10], &JudgeConfig::default()).unwrap();
    assert_eq!(zero.verdict, Verdict::Low, "{}", zero.reason);
}

#[test]
fn outlier_removal_drops_a_lone_spike() {
    let mut canary = spread(10.0);
    canary.push(1000.0);
    let baseline = spread(10.0);
    let kept = judge(&canary, &baseline, &JudgeConfig::default()).unwrap();
    assert_eq!(kept.canary_samples, 21);
    let cfg = JudgeConfig {
        remove_outliers: true,
        ..JudgeConfig::default()
    };
    let removed = judge(&canary, &baseline, &cfg).unwrap();
    assert_eq!(removed.canary_samples, 20);
    assert_eq!(removed.verdict, Verdict::Pass, "{}", removed.reason);
    assert!((removed.canary_mean.unwrap() - 10.0).abs() < 1e-12);
}

#[test]
fn infinite_samples_are_an_error_naming_the_side() {
    let mut baseline = spread(1.0);
    baseline[3] = f64::INFINITY;
    let err = judge(&spread(1.0), &baseline, &JudgeConfig::default()).unwrap_err();
    assert_eq!(
        err,
        JudgeError::NonFiniteSample {
            side: Side::Baseline,
            index: 3,
            value: f64::INFINITY
        }
    );
    assert!(
        err.to_string().contains("baseline sample 3 is inf"),
        "{err}"
    );
}

#[test]
fn one_sample_a_side_cannot_be_ranked() {
    let cfg = JudgeConfig {
        min_samples: 1,
        ..JudgeConfig::default()
    };
    let err = judge(&[2.0], &[1.0], &cfg).unwrap_err();
    assert!(matches!(err, JudgeError::AllTied { .. }), "{err}");
    assert!(err.to_string().contains("minSamples"), "{err}");
}

#[test]
fn the_rank_functions_name_an_empty_side() {
    use rollouts_analysis::judge::{shift_interval, z_statistic};
    let err = z_statistic(&[1.0], &[], 0.0).unwrap_err();
    assert_eq!(
        err,
        JudgeError::NoSamples {
            side: Side::Baseline
        }
    );
    let err = shift_interval(&[], &[1.0], 0.98).unwrap_err();
    assert_eq!(err, JudgeError::NoSamples { side: Side::Canary });
    assert!(err.to_string().contains("no canary samples"), "{err}");
}
