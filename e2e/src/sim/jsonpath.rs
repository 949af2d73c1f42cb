//! The JSONPath subset CRD printer columns use (`.a.b`, `.a[0]`, `.a[*]`, `.a['x.y']`, escaped
//! dots), evaluated to the first value it finds, as the API server's table printer shows one value
//! per cell.

use serde_json::Value;

/// One step of a simple JSONPath.
#[derive(Debug, PartialEq)]
enum Step {
    Field(String),
    Index(usize),
    AnyIndex,
}

/// Parses the simple JSONPaths CRD columns use: `.a.b`, `.a[0].b`, `.a['x.y']`, `.a[*]`,
/// `.labels.app\.kubernetes\.io/name`, optionally wrapped in `{}`.
fn parse_json_path(path: &str) -> Option<Vec<Step>> {
    let path = path.trim();
    let path = path
        .strip_prefix('{')
        .and_then(|p| p.strip_suffix('}'))
        .unwrap_or(path)
        .trim();
    let path = path.strip_prefix('$').unwrap_or(path);
    let mut steps = Vec::new();
    let mut chars = path.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '.' => {
                let mut field = String::new();
                while let Some(&n) = chars.peek() {
                    match n {
                        '\\' => {
                            chars.next();
                            field.extend(chars.next());
                        }
                        '.' | '[' => break,
                        _ => {
                            field.push(n);
                            chars.next();
                        }
                    }
                }
                if field.is_empty() {
                    return None;
                }
                steps.push(Step::Field(field));
            }
            '[' => {
                let mut inside = String::new();
                for n in chars.by_ref() {
                    if n == ']' {
                        break;
                    }
                    inside.push(n);
                }
                let inside = inside.trim();
                let quoted = inside
                    .strip_prefix('\'')
                    .and_then(|s| s.strip_suffix('\''))
                    .or_else(|| inside.strip_prefix('"').and_then(|s| s.strip_suffix('"')));
                steps.push(match quoted {
                    Some(field) => Step::Field(field.to_string()),
                    None if inside == "*" => Step::AnyIndex,
                    None => Step::Index(inside.parse().ok()?),
                });
            }
            _ => return None,
        }
    }
    Some(steps)
}

/// The first value `path` finds in `object`.
pub fn json_path<'a>(object: &'a Value, path: &str) -> Option<&'a Value> {
    parse_json_path(path)?
        .iter()
        .try_fold(object, |cur, step| match step {
            Step::Field(name) => cur.get(name),
            Step::Index(i) => cur.get(*i),
            Step::AnyIndex => cur.get(0),
        })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn json_path_forms() {
        let object = json!({
            "metadata": {"labels": {"a": "1", "app.kubernetes.io/name": "web"}},
            "spec": {"x": [{"y": "first"}, {"y": "second"}]}
        });
        assert_eq!(json_path(&object, ".metadata.labels.a"), Some(&json!("1")));
        assert_eq!(json_path(&object, ".spec.x[0].y"), Some(&json!("first")));
        assert_eq!(json_path(&object, ".spec.x[1].y"), Some(&json!("second")));
        assert_eq!(json_path(&object, ".spec.x[*].y"), Some(&json!("first")));
        assert_eq!(json_path(&object, "{.spec.x[1].y}"), Some(&json!("second")));
        assert_eq!(json_path(&object, "$.spec.x[1].y"), Some(&json!("second")));
        assert_eq!(
            json_path(&object, r".metadata.labels.app\.kubernetes\.io/name"),
            Some(&json!("web"))
        );
        assert_eq!(
            json_path(&object, ".metadata.labels['app.kubernetes.io/name']"),
            Some(&json!("web"))
        );
        assert_eq!(json_path(&object, ".spec.x[5].y"), None);
        assert_eq!(json_path(&object, ".spec.missing"), None);
        assert_eq!(
            json_path(&object, "spec.x"),
            None,
            "a path starts with a dot"
        );
        assert_eq!(json_path(&object, ".spec.x[a]"), None);
    }
}
