//! Label and field selectors: parsing the query-string and structured forms, and matching
//! objects the way the Kubernetes API server does for `labelSelector` and `fieldSelector`.

use std::fmt;

use serde_json::{Map, Value};

/// How one label requirement compares the label's value.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Operator {
    /// `a=b`, `a==b`: the label is present with the value.
    Equals,
    /// `a!=b`: the label is absent or has another value.
    NotEquals,
    /// `a in (b,c)`: the label is present with one of the values.
    In,
    /// `a notin (b,c)`: the label is absent or has none of the values.
    NotIn,
    /// `a`: the label is present.
    Exists,
    /// `!a`: the label is absent.
    DoesNotExist,
    /// `a>5`: the label is present and, read as an integer, greater than the value.
    GreaterThan,
    /// `a<5`: the label is present and, read as an integer, less than the value.
    LessThan,
}

/// One term of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Requirement {
    key: String,
    operator: Operator,
    values: Vec<String>,
}

impl Requirement {
    fn new(key: &str, operator: Operator, mut values: Vec<String>) -> Result<Self, String> {
        validate_label_key(key)?;
        values.sort();
        values.dedup();
        match operator {
            Operator::In | Operator::NotIn if values.is_empty() => {
                return Err(format!(
                    "label selector key {key:?}: 'in' and 'notin' need at least one value"
                ));
            }
            Operator::Exists | Operator::DoesNotExist if !values.is_empty() => {
                return Err(format!(
                    "label selector key {key:?}: 'exists' and 'does not exist' take no values"
                ));
            }
            Operator::GreaterThan | Operator::LessThan
                if values.len() != 1 || values[0].parse::<i64>().is_err() =>
            {
                return Err(format!(
                    "label selector key {key:?}: '>' and '<' need one integer value, got {values:?}"
                ));
            }
            _ => {}
        }
        for value in &values {
            validate_label_value(key, value)?;
        }
        Ok(Self {
            key: key.to_string(),
            operator,
            values,
        })
    }

    fn matches(&self, labels: Option<&Map<String, Value>>) -> bool {
        let value = labels
            .and_then(|l| l.get(&self.key))
            .and_then(Value::as_str);
        match (&self.operator, value) {
            (Operator::Equals | Operator::In, Some(v)) => self.values.iter().any(|x| x == v),
            (Operator::Equals | Operator::In, None) => false,
            (Operator::NotEquals | Operator::NotIn, Some(v)) => !self.values.iter().any(|x| x == v),
            (Operator::NotEquals | Operator::NotIn, None) => true,
            (Operator::Exists, v) => v.is_some(),
            (Operator::DoesNotExist, v) => v.is_none(),
            (Operator::GreaterThan | Operator::LessThan, None) => false,
            (op, Some(v)) => {
                let (Ok(have), Some(Ok(want))) = (
                    v.parse::<i64>(),
                    self.values.first().map(|w| w.parse::<i64>()),
                ) else {
                    return false;
                };
                if *op == Operator::GreaterThan {
                    have > want
                } else {
                    have < want
                }
            }
        }
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = &self.key;
        let values = self.values.join(",");
        match self.operator {
            Operator::Equals => write!(f, "{key}={values}"),
            Operator::NotEquals => write!(f, "{key}!={values}"),
            Operator::In => write!(f, "{key} in ({values})"),
            Operator::NotIn => write!(f, "{key} notin ({values})"),
            Operator::Exists => write!(f, "{key}"),
            Operator::DoesNotExist => write!(f, "!{key}"),
            Operator::GreaterThan => write!(f, "{key}>{values}"),
            Operator::LessThan => write!(f, "{key}<{values}"),
        }
    }
}

/// A parsed label selector (`a=b,c!=d,e in (f,g),h notin (i),j,!k`).
///
/// The default selector is empty and matches everything; [`LabelSelector::nothing`] (what a
/// missing structured selector means to Kubernetes) matches no object.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
    matches_nothing: bool,
}

impl LabelSelector {
    /// Parses the query-string form.
    pub fn parse(s: &str) -> Result<Self, String> {
        let requirements = Parser {
            tokens: lex(s),
            pos: 0,
        }
        .selector()
        .map_err(|e| format!("invalid label selector {s:?}: {e}"))?;
        Ok(Self {
            requirements,
            matches_nothing: false,
        })
    }

    /// The selector from a structured `{matchLabels, matchExpressions}` object. `null` (an
    /// absent selector) selects nothing, `{}` selects everything, as in Kubernetes.
    pub fn from_json(selector: &Value) -> Result<Self, String> {
        let object = match selector {
            Value::Null => return Ok(Self::nothing()),
            Value::Object(o) => o,
            other => return Err(format!("label selector must be an object, got {other}")),
        };
        let mut requirements = Vec::new();
        match object.get("matchLabels") {
            None | Some(Value::Null) => {}
            Some(Value::Object(labels)) => {
                for (key, value) in labels {
                    let value = value.as_str().ok_or_else(|| {
                        format!("selector.matchLabels.{key}: value must be a string, got {value}")
                    })?;
                    requirements.push(Requirement::new(
                        key,
                        Operator::Equals,
                        vec![value.to_string()],
                    )?);
                }
            }
            Some(other) => {
                return Err(format!(
                    "selector.matchLabels must be a map of strings, got {other}"
                ));
            }
        }
        match object.get("matchExpressions") {
            None | Some(Value::Null) => {}
            Some(Value::Array(expressions)) => {
                for (i, expression) in expressions.iter().enumerate() {
                    requirements.push(expression_requirement(i, expression)?);
                }
            }
            Some(other) => {
                return Err(format!(
                    "selector.matchExpressions must be a list, got {other}"
                ));
            }
        }
        Ok(Self {
            requirements,
            matches_nothing: false,
        })
    }

    /// A selector that matches no object.
    pub fn nothing() -> Self {
        Self {
            requirements: Vec::new(),
            matches_nothing: true,
        }
    }

    /// Whether this selector has no requirements and so selects every object.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty() && !self.matches_nothing
    }

    /// Whether an object with these labels is selected.
    pub fn matches(&self, labels: Option<&Map<String, Value>>) -> bool {
        !self.matches_nothing && self.requirements.iter().all(|r| r.matches(labels))
    }

    /// Whether `object` (with its labels at `metadata.labels`) is selected.
    pub fn matches_object(&self, object: &Value) -> bool {
        self.matches(object["metadata"]["labels"].as_object())
    }
}

impl fmt::Display for LabelSelector {
    /// The query-string form, as the API server prints a selector (e.g. in `status.selector`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut requirements: Vec<&Requirement> = self.requirements.iter().collect();
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        let terms: Vec<String> = requirements.iter().map(|r| r.to_string()).collect();
        f.write_str(&terms.join(","))
    }
}

fn expression_requirement(index: usize, expression: &Value) -> Result<Requirement, String> {
    let at = format!("selector.matchExpressions[{index}]");
    let key = expression["key"]
        .as_str()
        .ok_or_else(|| format!("{at}.key: required string"))?;
    let values = match &expression["values"] {
        Value::Null => Vec::new(),
        Value::Array(values) => values
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| format!("{at}.values: every value must be a string, got {v}"))
            })
            .collect::<Result<Vec<_>, _>>()?,
        other => {
            return Err(format!(
                "{at}.values: must be a list of strings, got {other}"
            ));
        }
    };
    let operator = match expression["operator"].as_str() {
        Some("In") => Operator::In,
        Some("NotIn") => Operator::NotIn,
        Some("Exists") => Operator::Exists,
        Some("DoesNotExist") => Operator::DoesNotExist,
        other => {
            return Err(format!(
                "{at}.operator: {other:?} is not one of In, NotIn, Exists, DoesNotExist"
            ));
        }
    };
    Requirement::new(key, operator, values).map_err(|e| format!("{at}: {e}"))
}

/// Checks a label key: an optional DNS subdomain prefix and `/`, then a name of at most 63
/// characters of alphanumerics, `-`, `_` and `.`, starting and ending alphanumeric.
fn validate_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        let valid_prefix = !prefix.is_empty()
            && prefix.len() <= 253
            && prefix.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !label.starts_with('-')
                    && !label.ends_with('-')
            });
        if !valid_prefix {
            return Err(format!(
                "label key {key:?}: prefix {prefix:?} must be a lowercase DNS subdomain such as example.com"
            ));
        }
    }
    if name.is_empty() || name.len() > 63 || !is_label_word(name) {
        return Err(format!(
            "label key {key:?}: name part must be 1-63 characters of [A-Za-z0-9-_.], starting and ending with a letter or digit"
        ));
    }
    Ok(())
}

fn validate_label_value(key: &str, value: &str) -> Result<(), String> {
    if value.len() > 63 || !(value.is_empty() || is_label_word(value)) {
        return Err(format!(
            "label {key:?}: value {value:?} must be at most 63 characters of [A-Za-z0-9-_.], starting and ending with a letter or digit"
        ));
    }
    Ok(())
}

fn is_label_word(s: &str) -> bool {
    let bytes = s.as_bytes();
    bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Word(String),
    Not,
    Equals,
    DoubleEquals,
    NotEquals,
    Greater,
    Less,
    Open,
    Close,
    Comma,
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Token::Word(w) => write!(f, "'{w}'"),
            Token::Not => f.write_str("'!'"),
            Token::Equals => f.write_str("'='"),
            Token::DoubleEquals => f.write_str("'=='"),
            Token::NotEquals => f.write_str("'!='"),
            Token::Greater => f.write_str("'>'"),
            Token::Less => f.write_str("'<'"),
            Token::Open => f.write_str("'('"),
            Token::Close => f.write_str("')'"),
            Token::Comma => f.write_str("','"),
        }
    }
}

fn is_symbol(c: char) -> bool {
    matches!(c, '=' | '!' | '(' | ')' | ',' | '>' | '<')
}

fn lex(s: &str) -> Vec<Token> {
    let mut tokens = Vec::new();
    let mut chars = s.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
            continue;
        }
        if is_symbol(c) {
            chars.next();
            let followed_by_equals = chars.peek() == Some(&'=');
            let token = match c {
                '=' if followed_by_equals => Token::DoubleEquals,
                '!' if followed_by_equals => Token::NotEquals,
                '=' => Token::Equals,
                '!' => Token::Not,
                '(' => Token::Open,
                ')' => Token::Close,
                ',' => Token::Comma,
                '>' => Token::Greater,
                _ => Token::Less,
            };
            if matches!(token, Token::DoubleEquals | Token::NotEquals) {
                chars.next();
            }
            tokens.push(token);
            continue;
        }
        let mut word = String::new();
        while let Some(&c) = chars.peek() {
            if c.is_whitespace() || is_symbol(c) {
                break;
            }
            word.push(c);
            chars.next();
        }
        tokens.push(Token::Word(word));
    }
    tokens
}

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.pos)
    }

    fn next(&mut self) -> Option<Token> {
        let token = self.tokens.get(self.pos).cloned();
        self.pos += 1;
        token
    }

    fn selector(&mut self) -> Result<Vec<Requirement>, String> {
        let mut requirements = Vec::new();
        if self.peek().is_none() {
            return Ok(requirements);
        }
        loop {
            requirements.push(self.requirement()?);
            match self.next() {
                None => return Ok(requirements),
                Some(Token::Comma) => {
                    if !matches!(self.peek(), Some(Token::Word(_) | Token::Not)) {
                        return Err(format!(
                            "found {}, expected a label key after ','",
                            describe(self.peek())
                        ));
                    }
                }
                Some(other) => {
                    return Err(format!("found {other}, expected ',' or end of selector"));
                }
            }
        }
    }

    fn requirement(&mut self) -> Result<Requirement, String> {
        let negated = self.peek() == Some(&Token::Not);
        if negated {
            self.next();
        }
        let key = match self.next() {
            Some(Token::Word(key)) => key,
            other => {
                return Err(format!(
                    "found {}, expected a label key",
                    describe(other.as_ref())
                ));
            }
        };
        let at_end = matches!(self.peek(), None | Some(Token::Comma));
        if negated {
            if !at_end {
                return Err(format!(
                    "found {} after '!{key}', expected ',' or end of selector",
                    describe(self.peek())
                ));
            }
            return Requirement::new(&key, Operator::DoesNotExist, Vec::new());
        }
        if at_end {
            return Requirement::new(&key, Operator::Exists, Vec::new());
        }
        let operator = match self.next() {
            Some(Token::Equals | Token::DoubleEquals) => Operator::Equals,
            Some(Token::NotEquals) => Operator::NotEquals,
            Some(Token::Greater) => Operator::GreaterThan,
            Some(Token::Less) => Operator::LessThan,
            Some(Token::Word(w)) if w == "in" => {
                return Requirement::new(&key, Operator::In, self.value_set()?);
            }
            Some(Token::Word(w)) if w == "notin" => {
                return Requirement::new(&key, Operator::NotIn, self.value_set()?);
            }
            other => {
                return Err(format!(
                    "found {} after key {key:?}, expected one of =, ==, !=, in, notin, >, <",
                    describe(other.as_ref())
                ));
            }
        };
        let value = match self.peek().cloned() {
            None | Some(Token::Comma) => String::new(),
            Some(Token::Word(w)) => {
                self.next();
                w
            }
            Some(other) => {
                return Err(format!("found {other} after key {key:?}, expected a value"));
            }
        };
        Requirement::new(&key, operator, vec![value])
    }

    /// `( v1, v2 )`; empty members are the empty value, as the API server reads them.
    fn value_set(&mut self) -> Result<Vec<String>, String> {
        match self.next() {
            Some(Token::Open) => {}
            other => {
                return Err(format!(
                    "found {}, expected '(' to open the value set",
                    describe(other.as_ref())
                ));
            }
        }
        let mut values = Vec::new();
        let mut current: Option<String> = None;
        loop {
            match self.next() {
                Some(Token::Word(w)) => {
                    if current.is_some() {
                        return Err(format!("found '{w}', expected ',' or ')' in the value set"));
                    }
                    current = Some(w);
                }
                Some(Token::Comma) => values.push(current.take().unwrap_or_default()),
                Some(Token::Close) => {
                    values.push(current.take().unwrap_or_default());
                    return Ok(values);
                }
                other => {
                    return Err(format!(
                        "found {}, expected a value, ',' or ')' in the value set",
                        describe(other.as_ref())
                    ));
                }
            }
        }
    }
}

fn describe(token: Option<&Token>) -> String {
    token.map_or_else(|| "end of selector".to_string(), Token::to_string)
}

/// How a field requirement compares.
#[derive(Debug, Clone, PartialEq, Eq)]
enum FieldOperator {
    Equals,
    NotEquals,
}

/// A parsed field selector (`metadata.name=x,metadata.namespace!=y`).
///
/// Any dotted path is accepted (`status.phase`, `spec.nodeName`); a missing field reads as the
/// empty string, and numbers and booleans compare by their text (`spec.replicas=3`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector {
    requirements: Vec<(String, FieldOperator, String)>,
}

impl FieldSelector {
    /// Parses the query-string form; values may escape `\,`, `\=` and `\\`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut requirements = Vec::new();
        for term in split_unescaped_commas(s) {
            if term.trim().is_empty() {
                continue;
            }
            let (field, operator, raw) = split_field_term(term).ok_or_else(|| {
                format!(
                    "invalid field selector {s:?}: cannot understand {term:?}; expected field=value, field==value or field!=value"
                )
            })?;
            let field = field.trim();
            if field.is_empty() || field.split('.').any(str::is_empty) {
                return Err(format!(
                    "invalid field selector {s:?}: {field:?} is not a dotted field path such as metadata.name"
                ));
            }
            let value = unescape_field_value(raw)
                .map_err(|e| format!("invalid field selector {s:?}: {e}"))?;
            requirements.push((field.to_string(), operator, value));
        }
        Ok(Self { requirements })
    }

    /// Whether this selector has no requirements and so selects every object.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Whether `obj` is selected.
    pub fn matches(&self, obj: &Value) -> bool {
        self.requirements.iter().all(|(path, operator, want)| {
            let mut cur = obj;
            for seg in path.split('.') {
                cur = cur.get(seg).unwrap_or(&Value::Null);
            }
            let have = match cur {
                Value::Null => String::new(),
                Value::String(s) => s.clone(),
                Value::Bool(_) | Value::Number(_) => cur.to_string(),
                // Lists and maps never equal a field selector value.
                _ => return *operator == FieldOperator::NotEquals,
            };
            (have == *want) == (*operator == FieldOperator::Equals)
        })
    }
}

fn split_unescaped_commas(s: &str) -> Vec<&str> {
    let mut terms = Vec::new();
    let mut start = 0;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            ',' => {
                terms.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    terms.push(&s[start..]);
    terms
}

/// Splits at the first operator, trying `!=` and `==` before `=` as the API server does.
fn split_field_term(term: &str) -> Option<(&str, FieldOperator, &str)> {
    for (i, _) in term.char_indices() {
        let rest = &term[i..];
        if let Some(value) = rest.strip_prefix("!=") {
            return Some((&term[..i], FieldOperator::NotEquals, value));
        }
        if let Some(value) = rest.strip_prefix("==") {
            return Some((&term[..i], FieldOperator::Equals, value));
        }
        if let Some(value) = rest.strip_prefix('=') {
            return Some((&term[..i], FieldOperator::Equals, value));
        }
    }
    None
}

fn unescape_field_value(raw: &str) -> Result<String, String> {
    let mut value = String::with_capacity(raw.len());
    let mut escaped = false;
    for c in raw.chars() {
        if escaped {
            if !matches!(c, '\\' | ',' | '=') {
                return Err(format!(
                    "invalid escape sequence '\\{c}' in value {raw:?}; only \\\\, \\, and \\= are allowed"
                ));
            }
            value.push(c);
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == '=' {
            return Err(format!("unescaped '=' in value {raw:?}; write it as \\="));
        } else {
            value.push(c);
        }
    }
    if escaped {
        return Err(format!("value {raw:?} ends with a lone backslash"));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn labels(v: Value) -> Map<String, Value> {
        v.as_object().cloned().expect("labels are an object")
    }

    fn selects(selector: &str, l: Value) -> bool {
        LabelSelector::parse(selector)
            .expect("selector parses")
            .matches(Some(&labels(l)))
    }

    #[test]
    fn equality_forms() {
        let l = json!({"app": "web", "tier": "front"});
        assert!(selects("app=web", l.clone()));
        assert!(selects("app==web", l.clone()));
        assert!(selects("app = web , tier == front", l.clone()));
        assert!(!selects("app=api", l.clone()));
        assert!(!selects("app!=web", l.clone()));
        assert!(selects("app!=api", l.clone()));
        // != matches objects without the label, as in Kubernetes.
        assert!(selects("missing!=x", l.clone()));
        assert!(!selects("missing=x", l));
    }

    #[test]
    fn empty_value_equality() {
        assert!(selects("a=", json!({"a": ""})));
        assert!(!selects("a=", json!({"a": "x"})));
        assert!(!selects("a=", json!({})));
        assert!(selects("a=,b=c", json!({"a": "", "b": "c"})));
    }

    #[test]
    fn set_forms() {
        let l = json!({"env": "prod", "zone": "b"});
        assert!(selects("env in (prod,staging)", l.clone()));
        assert!(selects("env in(prod, staging)", l.clone()));
        assert!(!selects("env in (dev)", l.clone()));
        assert!(!selects("env notin (prod)", l.clone()));
        assert!(selects("env notin (dev,qa)", l.clone()));
        assert!(selects("missing notin (x)", l.clone()));
        assert!(!selects("missing in (x)", l.clone()));
        // Commas inside parentheses belong to the set.
        assert!(selects("env in (a,prod),zone in (b)", l));
    }

    #[test]
    fn existence_forms() {
        let l = json!({"app": "web"});
        assert!(selects("app", l.clone()));
        assert!(!selects("!app", l.clone()));
        assert!(selects("!other", l.clone()));
        assert!(!selects("other", l.clone()));
        assert!(selects("app,!other", l.clone()));
        assert!(selects(" app , ! other ", l));
    }

    #[test]
    fn numeric_comparisons() {
        let l = json!({"gen": "5"});
        assert!(selects("gen>3", l.clone()));
        assert!(!selects("gen>5", l.clone()));
        assert!(selects("gen<10", l.clone()));
        assert!(!selects("gen<5", json!({"gen": "x"})));
        assert!(!selects("gen<5", json!({})));
        assert!(LabelSelector::parse("gen>x").is_err());
    }

    #[test]
    fn empty_selector_matches_everything() {
        let s = LabelSelector::parse("").unwrap();
        assert!(s.is_empty());
        assert!(s.matches(None));
        assert!(s.matches(Some(&labels(json!({"a": "b"})))));
        assert!(LabelSelector::parse("   ").unwrap().is_empty());
        assert!(!LabelSelector::parse("a").unwrap().is_empty());
    }

    #[test]
    fn objects_without_labels() {
        let s = LabelSelector::parse("a!=b,!c,d notin (e)").unwrap();
        assert!(s.matches(None));
        assert!(!LabelSelector::parse("a").unwrap().matches(None));
        assert!(s.matches_object(&json!({"metadata": {"name": "x"}})));
        assert!(
            !s.matches_object(&json!({"metadata": {"labels": {"c": "1"}}})),
            "a present label c fails !c"
        );
    }

    #[test]
    fn keys_with_prefixes() {
        let l = json!({"app.kubernetes.io/name": "web", "rollouts-pod-template-hash": "abc123"});
        assert!(selects(
            "app.kubernetes.io/name=web,rollouts-pod-template-hash in (abc123)",
            l
        ));
    }

    #[test]
    fn malformed_selectors_are_refused_with_reasons() {
        for (bad, reason) in [
            ("a=b,", "after ','"),
            (",a=b", "expected a label key"),
            ("a=b,,c=d", "after ','"),
            ("a in (x", "value set"),
            ("a in x", "'('"),
            ("a notin", "'('"),
            ("a b", "expected one of"),
            ("a=b=c", "expected ','"),
            ("a=(b)", "expected a value"),
            ("!a=b", "after '!a'"),
            ("!", "expected a label key"),
            ("-bad=x", "name part"),
            ("Upper.Case/x=y", "prefix"),
            ("a=-x", "value"),
            ("a in (x y)", "value set"),
        ] {
            let err = LabelSelector::parse(bad).expect_err(bad);
            assert!(err.contains(reason), "{bad:?}: {err}");
            assert!(err.contains(&format!("{bad:?}")), "{bad:?}: {err}");
        }
        let long = "a".repeat(64);
        assert!(LabelSelector::parse(&format!("{long}=x")).is_err());
        assert!(LabelSelector::parse(&format!("x={long}")).is_err());
    }

    #[test]
    fn empty_members_of_a_set_are_the_empty_value() {
        assert!(selects("a in (x,)", json!({"a": ""})));
        assert!(selects("a in ()", json!({"a": ""})));
        assert!(!selects("a in (x,)", json!({"a": "y"})));
    }

    #[test]
    fn structured_selector() {
        let s = LabelSelector::from_json(&json!({
            "matchLabels": {"app": "web"},
            "matchExpressions": [
                {"key": "env", "operator": "In", "values": ["prod", "staging"]},
                {"key": "canary", "operator": "DoesNotExist"},
                {"key": "zone", "operator": "NotIn", "values": ["a"]},
                {"key": "tier", "operator": "Exists", "values": []}
            ]
        }))
        .unwrap();
        assert!(s.matches(Some(&labels(
            json!({"app": "web", "env": "prod", "tier": "x", "zone": "b"})
        ))));
        assert!(!s.matches(Some(&labels(
            json!({"app": "web", "env": "prod", "tier": "x", "canary": "1"})
        ))));
        assert!(!s.matches(Some(&labels(
            json!({"app": "web", "env": "dev", "tier": "x"})
        ))));
        assert!(!s.matches(Some(&labels(json!({"app": "web", "env": "prod"})))));
        assert!(!s.matches(Some(&labels(
            json!({"app": "web", "env": "prod", "tier": "x", "zone": "a"})
        ))));
    }

    #[test]
    fn structured_empty_and_absent() {
        let everything = LabelSelector::from_json(&json!({})).unwrap();
        assert!(everything.is_empty());
        assert!(everything.matches(None));
        let also_everything =
            LabelSelector::from_json(&json!({"matchLabels": {}, "matchExpressions": []})).unwrap();
        assert!(also_everything.matches(Some(&labels(json!({"x": "y"})))));
        let nothing = LabelSelector::from_json(&Value::Null).unwrap();
        assert!(!nothing.is_empty());
        assert!(!nothing.matches(None));
        assert!(!nothing.matches(Some(&labels(json!({"x": "y"})))));
    }

    #[test]
    fn structured_errors_name_the_field() {
        for (bad, reason) in [
            (
                json!({"matchExpressions": [{"key": "a", "operator": "Equals"}]}),
                "matchExpressions[0].operator",
            ),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "In", "values": []}]}),
                "at least one value",
            ),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}),
                "take no values",
            ),
            (
                json!({"matchExpressions": [{"operator": "Exists"}]}),
                "matchExpressions[0].key",
            ),
            (json!({"matchLabels": {"a": 1}}), "matchLabels.a"),
            (json!({"matchLabels": ["a"]}), "matchLabels"),
            (json!("app=web"), "must be an object"),
        ] {
            let err = LabelSelector::from_json(&bad).expect_err(&bad.to_string());
            assert!(err.contains(reason), "{bad}: {err}");
        }
    }

    #[test]
    fn display_round_trips() {
        let s = LabelSelector::parse("b in (y,x),a=1,!c,d,e notin (z),f!=g").unwrap();
        let printed = s.to_string();
        assert_eq!(printed, "a=1,b in (x,y),!c,d,e notin (z),f!=g");
        assert_eq!(LabelSelector::parse(&printed).unwrap().to_string(), printed);
        let structured = LabelSelector::from_json(&json!({"matchLabels": {"app": "web"}})).unwrap();
        assert_eq!(structured.to_string(), "app=web");
    }

    #[test]
    fn field_selector_on_metadata() {
        let pod = json!({"metadata": {"name": "web-1", "namespace": "prod"}, "status": {"phase": "Running"}});
        let sel = |s: &str| FieldSelector::parse(s).unwrap().matches(&pod);
        assert!(sel("metadata.name=web-1"));
        assert!(sel("metadata.name==web-1"));
        assert!(!sel("metadata.name!=web-1"));
        assert!(sel("metadata.name=web-1,metadata.namespace=prod"));
        assert!(!sel("metadata.name=web-1,metadata.namespace=dev"));
        assert!(sel("metadata.namespace!=dev"));
        assert!(sel("status.phase=Running"));
        assert!(sel(""));
    }

    #[test]
    fn field_selector_on_any_path() {
        let pod = json!({
            "metadata": {"name": "p"},
            "spec": {"replicas": 3, "paused": false},
        });
        let sel = |s: &str| FieldSelector::parse(s).unwrap().matches(&pod);
        // A missing field reads as empty, so an unscheduled pod has spec.nodeName="".
        assert!(sel("spec.nodeName="));
        assert!(sel("spec.nodeName!=node-1"));
        assert!(!sel("spec.nodeName=node-1"));
        assert!(sel("spec.replicas=3"));
        assert!(sel("spec.paused=false"));
        assert!(!sel("spec=x"), "a map never equals a value");
        assert!(sel("spec!=x"));
    }

    #[test]
    fn field_selector_escapes() {
        let obj = json!({"metadata": {"name": "a,b=c\\d"}});
        let s = FieldSelector::parse(r"metadata.name=a\,b\=c\\d").unwrap();
        assert!(s.matches(&obj));
        assert!(!s.is_empty());
        assert!(FieldSelector::parse("").unwrap().is_empty());
    }

    #[test]
    fn field_selector_errors() {
        for (bad, reason) in [
            ("metadata.name", "cannot understand"),
            ("metadata.name=a=b", "unescaped '='"),
            (r"metadata.name=a\x", "escape"),
            (r"metadata.name=a\", "lone backslash"),
            ("=x", "dotted field path"),
            ("metadata..name=x", "dotted field path"),
        ] {
            let err = FieldSelector::parse(bad).expect_err(bad);
            assert!(err.contains(reason), "{bad:?}: {err}");
        }
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;

        /// Tokens of the query-string forms, so generated selectors often parse.
        fn selector_text() -> impl Strategy<Value = String> {
            let token = prop_oneof![
                Just("app"),
                Just("a.b/c"),
                Just("x"),
                Just("="),
                Just("=="),
                Just("!="),
                Just("!"),
                Just(","),
                Just(" in "),
                Just(" notin "),
                Just("("),
                Just(")"),
                Just(">"),
                Just("<"),
                Just("5"),
                Just("-9223372036854775808"),
                Just("99999999999999999999"),
                Just("\\,"),
                Just("\\="),
                Just("\\\\"),
                Just("metadata.name"),
                Just("."),
                Just(" "),
            ];
            prop_oneof![
                proptest::collection::vec(token, 0..12).prop_map(|t| t.concat()),
                "\\PC{0,30}",
            ]
        }

        fn labels() -> impl Strategy<Value = Map<String, Value>> {
            proptest::collection::btree_map(
                prop_oneof![Just("app".to_string()), Just("x".to_string()), "[a-z]{1,3}"],
                prop_oneof![
                    "[a-z0-9]{0,3}".prop_map(Value::from),
                    any::<i64>().prop_map(|n| Value::from(n.to_string())),
                    Just(Value::Null),
                ],
                0..4,
            )
            .prop_map(|m| m.into_iter().collect())
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(500))]

            /// Any text: a selector or an error naming it; a selector matches any labels.
            #[test]
            fn any_label_selector_parses_or_errs(text in selector_text(), l in labels()) {
                if let Ok(selector) = LabelSelector::parse(&text) {
                    let _ = selector.matches(Some(&l));
                    let _ = selector.to_string();
                }
            }

            #[test]
            fn any_field_selector_parses_or_errs(text in selector_text()) {
                let _ = FieldSelector::parse(&text);
            }

            /// Any structured selector, however malformed.
            #[test]
            fn any_structured_selector_parses_or_errs(
                key in prop_oneof![Just("app".to_string()), "\\PC{0,8}"],
                operator in prop_oneof![
                    Just("In"), Just("NotIn"), Just("Exists"), Just("DoesNotExist"), Just("Gt"),
                    Just("Lt"), Just("in"), Just(""),
                ],
                values in proptest::option::of(proptest::collection::vec("\\PC{0,6}", 0..3)),
                match_labels in proptest::option::of(labels()),
                l in labels(),
            ) {
                let selector = json!({
                    "matchLabels": match_labels,
                    "matchExpressions": [{"key": key, "operator": operator, "values": values}],
                });
                if let Ok(selector) = LabelSelector::from_json(&selector) {
                    let _ = selector.matches(Some(&l));
                }
            }
        }
    }
}
