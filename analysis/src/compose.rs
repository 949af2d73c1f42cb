//! Composing an AnalysisRun spec from templates, as Argo does when a Rollout or Experiment
//! starts an analysis: referenced templates are gathered (nested `templates` included), their
//! metrics, arguments, dry-run and retention rules combined, and the caller's argument values
//! merged in.

use std::collections::BTreeSet;

use rollouts_crds::analysis::{
    AnalysisRunArgument, AnalysisRunSpec, AnalysisTemplateSpec, DryRun, MeasurementRetention,
    RolloutAnalysisTemplate,
};

/// A template found for a reference: its name and spec.
#[derive(Clone, Debug, PartialEq)]
pub struct FoundTemplate {
    pub name: String,
    pub spec: AnalysisTemplateSpec,
}

/// The templates gathered from references, namespaced and cluster-scoped apart, each once, in
/// the order first reached (a template, then the templates it references).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Templates {
    pub namespaced: Vec<FoundTemplate>,
    pub cluster: Vec<FoundTemplate>,
}

/// How deep templates may reference templates (`templates` of a template's `templates`...).
pub const MAX_TEMPLATE_DEPTH: usize = 32;
/// The most templates one analysis may gather.
pub const MAX_TEMPLATES: usize = 100;

/// Gathers the templates `refs` name, following each template's own `templates`. `lookup`
/// fetches one (its error, e.g. "not found", is returned as is). A template reached twice
/// (or through a cycle) is taken once. Nesting deeper than [`MAX_TEMPLATE_DEPTH`] or more
/// than [`MAX_TEMPLATES`] templates is an error naming the template reached.
pub fn gather(
    refs: &[RolloutAnalysisTemplate],
    mut lookup: impl FnMut(&RolloutAnalysisTemplate) -> Result<AnalysisTemplateSpec, String>,
) -> Result<Templates, String> {
    fn visit(
        refs: &[RolloutAnalysisTemplate],
        lookup: &mut dyn FnMut(&RolloutAnalysisTemplate) -> Result<AnalysisTemplateSpec, String>,
        seen: &mut BTreeSet<(bool, String)>,
        found: &mut Templates,
        depth: usize,
    ) -> Result<(), String> {
        for reference in refs {
            let cluster = reference.cluster_scope == Some(true);
            if !seen.insert((cluster, reference.template_name.clone())) {
                continue;
            }
            if depth > MAX_TEMPLATE_DEPTH {
                return Err(format!(
                    "AnalysisTemplate {:?} is nested more than {MAX_TEMPLATE_DEPTH} templates deep: reference fewer levels of templates",
                    reference.template_name
                ));
            }
            if seen.len() > MAX_TEMPLATES {
                return Err(format!(
                    "AnalysisTemplate {:?} would be template number {}, more than the {MAX_TEMPLATES} one analysis may use: reference fewer templates",
                    reference.template_name,
                    seen.len()
                ));
            }
            let spec = lookup(reference)?;
            let nested = spec.templates.clone();
            let template = FoundTemplate {
                name: reference.template_name.clone(),
                spec,
            };
            if cluster {
                found.cluster.push(template);
            } else {
                found.namespaced.push(template);
            }
            visit(&nested, lookup, seen, found, depth.saturating_add(1))?;
        }
        Ok(())
    }
    let mut found = Templates::default();
    visit(refs, &mut lookup, &mut BTreeSet::new(), &mut found, 1)?;
    Ok(found)
}

/// The run spec for `templates` with the caller's `args`, `dry_run` and `retention` (from the
/// Rollout step or Experiment). Errors, as Argo's: two metrics with one name, an argument
/// declared twice with different values, a dry-run or retention rule given twice, an argument
/// left without a value.
pub fn run_spec(
    templates: &Templates,
    args: &[AnalysisRunArgument],
    dry_run: &[DryRun],
    retention: &[MeasurementRetention],
) -> Result<AnalysisRunSpec, String> {
    let all = || templates.namespaced.iter().chain(&templates.cluster);

    let mut metrics = Vec::new();
    let mut names = BTreeSet::new();
    for metric in all().flat_map(|t| &t.spec.metrics) {
        if !names.insert(metric.name.as_str()) {
            return Err(format!("two metrics have the same name '{}'", metric.name));
        }
        metrics.push(metric.clone());
    }

    let mut template_args: Vec<AnalysisRunArgument> = Vec::new();
    for arg in all().flat_map(|t| &t.spec.args) {
        match template_args.iter_mut().find(|a| a.name == arg.name) {
            None => template_args.push(arg.clone()),
            Some(previous) => {
                if let (Some(before), Some(now)) = (&previous.value, &arg.value)
                    && before != now
                {
                    return Err(format!(
                        "Argument `{}` specified multiple times with different values: '{before}', '{now}'",
                        arg.name
                    ));
                }
                // A value already given is not replaced by a declaration without one.
                if previous.value.is_none() {
                    *previous = arg.clone();
                }
            }
        }
    }
    let args = merge_args(args, template_args)?;

    let dry_run: Vec<DryRun> = dry_run
        .iter()
        .chain(all().flat_map(|t| &t.spec.dry_run))
        .cloned()
        .collect();
    unique(dry_run.iter().map(|r| r.metric_name.as_str()), "Dry-Run")?;
    let measurement_retention: Vec<MeasurementRetention> = retention
        .iter()
        .chain(all().flat_map(|t| &t.spec.measurement_retention))
        .cloned()
        .collect();
    unique(
        measurement_retention.iter().map(|r| r.metric_name.as_str()),
        "Measurement Retention",
    )?;

    Ok(AnalysisRunSpec {
        metrics,
        args,
        dry_run,
        measurement_retention,
        ..Default::default()
    })
}

fn unique<'a>(names: impl Iterator<Item = &'a str>, rule: &str) -> Result<(), String> {
    let mut seen = BTreeSet::new();
    for name in names {
        if !seen.insert(name) {
            return Err(format!(
                "two {rule} metric rules have the same name '{name}'"
            ));
        }
    }
    Ok(())
}

/// The template's arguments with the caller's values put in (arguments the templates do not
/// declare are ignored); every argument must end with a value or a `valueFrom`.
pub fn merge_args(
    incoming: &[AnalysisRunArgument],
    template_args: Vec<AnalysisRunArgument>,
) -> Result<Vec<AnalysisRunArgument>, String> {
    let mut merged = template_args;
    for arg in incoming {
        if let Some(target) = merged.iter_mut().find(|a| a.name == arg.name) {
            if arg.value.is_some() {
                target.value = arg.value.clone();
            } else if arg.value_from.is_some() {
                target.value_from = arg.value_from.clone();
            }
        }
    }
    if let Some(unresolved) = merged
        .iter()
        .find(|a| a.value.is_none() && a.value_from.is_none())
    {
        return Err(format!(
            "args.{} was not resolved: pass a value for {:?} in the analysis args, or give it a default in the template",
            unresolved.name, unresolved.name
        ));
    }
    Ok(merged)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use rollouts_crds::analysis::Metric;

    fn arg(name: &str, value: Option<&str>) -> AnalysisRunArgument {
        AnalysisRunArgument {
            name: name.into(),
            value: value.map(Into::into),
            value_from: None,
        }
    }

    fn reference(name: &str, cluster: bool) -> RolloutAnalysisTemplate {
        RolloutAnalysisTemplate {
            template_name: name.into(),
            cluster_scope: cluster.then_some(true),
        }
    }

    fn template(metrics: &[&str], args: Vec<AnalysisRunArgument>) -> AnalysisTemplateSpec {
        AnalysisTemplateSpec {
            metrics: metrics
                .iter()
                .map(|name| Metric {
                    name: name.to_string(),
                    ..Default::default()
                })
                .collect(),
            args,
            ..Default::default()
        }
    }

    fn names(templates: &[FoundTemplate]) -> Vec<&str> {
        templates.iter().map(|t| t.name.as_str()).collect()
    }

    #[test]
    fn nested_templates_are_gathered_once_even_through_a_cycle() {
        let mut store: BTreeMap<(bool, &str), AnalysisTemplateSpec> = BTreeMap::new();
        let mut a = template(&["a"], vec![]);
        a.templates = vec![reference("c", false), reference("shared", true)];
        let mut c = template(&["c"], vec![]);
        c.templates = vec![reference("a", false)];
        store.insert((false, "a"), a);
        store.insert((false, "b"), template(&["b"], vec![]));
        store.insert((false, "c"), c);
        store.insert((true, "shared"), template(&["shared"], vec![]));
        let lookup = |r: &RolloutAnalysisTemplate| {
            store
                .get(&(r.cluster_scope == Some(true), r.template_name.as_str()))
                .cloned()
                .ok_or_else(|| format!("AnalysisTemplate {:?} not found", r.template_name))
        };
        let found = gather(
            &[
                reference("a", false),
                reference("b", false),
                reference("c", false),
            ],
            lookup,
        )
        .unwrap();
        assert_eq!(names(&found.namespaced), ["a", "c", "b"]);
        assert_eq!(names(&found.cluster), ["shared"]);

        let err = gather(&[reference("missing", false)], lookup).unwrap_err();
        assert!(err.contains("\"missing\" not found"));
    }

    #[test]
    fn deep_or_many_templates_are_refused_naming_the_one_reached() {
        // t0 -> t1 -> ... -> t139, each its own template.
        let chain = |length: usize| {
            move |r: &RolloutAnalysisTemplate| {
                let index: usize = r.template_name[1..].parse().map_err(|_| "bad name")?;
                let mut spec = template(&[&r.template_name], vec![]);
                if index + 1 < length {
                    spec.templates = vec![reference(&format!("t{}", index + 1), false)];
                }
                Ok::<_, String>(spec)
            }
        };
        let err = gather(&[reference("t0", false)], chain(140)).unwrap_err();
        assert!(
            err.contains("\"t32\" is nested more than 32 templates deep"),
            "{err}"
        );
        let found = gather(&[reference("t0", false)], chain(32)).unwrap();
        assert_eq!(found.namespaced.len(), 32);

        let many: Vec<_> = (0..=MAX_TEMPLATES)
            .map(|i| reference(&format!("t{i}"), false))
            .collect();
        let err = gather(&many, chain(1)).unwrap_err();
        assert!(err.contains("more than the 100"), "{err}");
    }

    #[test]
    fn a_run_spec_combines_templates_namespaced_first() {
        let templates = Templates {
            namespaced: vec![FoundTemplate {
                name: "t".into(),
                spec: template(&["one", "two"], vec![arg("svc", None)]),
            }],
            cluster: vec![FoundTemplate {
                name: "c".into(),
                spec: template(
                    &["three"],
                    vec![arg("svc", None), arg("port", Some("9090"))],
                ),
            }],
        };
        let spec = run_spec(
            &templates,
            &[arg("svc", Some("checkout")), arg("unused", Some("x"))],
            &[DryRun {
                metric_name: "two".into(),
            }],
            &[],
        )
        .unwrap();
        let metric_names: Vec<&str> = spec.metrics.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(metric_names, ["one", "two", "three"]);
        assert_eq!(
            spec.args,
            vec![arg("svc", Some("checkout")), arg("port", Some("9090"))]
        );
        assert_eq!(spec.dry_run.len(), 1);
    }

    #[test]
    fn composition_errors_follow_argo() {
        let two = |a: AnalysisTemplateSpec, b: AnalysisTemplateSpec| Templates {
            namespaced: vec![
                FoundTemplate {
                    name: "a".into(),
                    spec: a,
                },
                FoundTemplate {
                    name: "b".into(),
                    spec: b,
                },
            ],
            cluster: vec![],
        };
        let err = run_spec(
            &two(template(&["m"], vec![]), template(&["m"], vec![])),
            &[],
            &[],
            &[],
        )
        .unwrap_err();
        assert_eq!(err, "two metrics have the same name 'm'");

        let err = run_spec(
            &two(
                template(&["x"], vec![arg("a", Some("1"))]),
                template(&["y"], vec![arg("a", Some("2"))]),
            ),
            &[],
            &[],
            &[],
        )
        .unwrap_err();
        assert!(err.contains("Argument `a` specified multiple times"));

        let err = run_spec(
            &two(
                template(&["x"], vec![arg("need", None)]),
                template(&["y"], vec![]),
            ),
            &[],
            &[],
            &[],
        )
        .unwrap_err();
        assert!(err.starts_with("args.need was not resolved"), "{err}");

        let rule = DryRun {
            metric_name: "x".into(),
        };
        let mut with_rule = template(&["x"], vec![]);
        with_rule.dry_run = vec![rule.clone()];
        let err =
            run_spec(&two(with_rule, template(&["y"], vec![])), &[], &[rule], &[]).unwrap_err();
        assert_eq!(err, "two Dry-Run metric rules have the same name 'x'");
    }

    #[test]
    fn a_template_default_survives_a_later_declaration_without_value() {
        let templates = Templates {
            namespaced: vec![
                FoundTemplate {
                    name: "a".into(),
                    spec: template(&["x"], vec![arg("port", Some("9090"))]),
                },
                FoundTemplate {
                    name: "b".into(),
                    spec: template(&["y"], vec![arg("port", None)]),
                },
            ],
            cluster: vec![],
        };
        let spec = run_spec(&templates, &[], &[], &[]).unwrap();
        assert_eq!(spec.args, vec![arg("port", Some("9090"))]);
    }
}
