//! Bounds on expr-lang expressions (`successCondition`, `failureCondition`, a range query's
//! `start` and `end`), checked without parsing: the expression engine recurses once per
//! nesting level, so a deeply nested expression must be refused before it reaches the parser.

/// The longest expression evaluated, in bytes.
pub const MAX_LENGTH: usize = 4096;

/// The deepest nesting of `(`, `[` and `{` (outside string literals) an expression may have.
pub const MAX_NESTING: usize = 64;

/// Why an expression is refused before parsing.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BoundError {
    #[error("the expression is {length} bytes long, over the limit of {MAX_LENGTH}: shorten it")]
    TooLong { length: usize },
    #[error(
        "the expression nests brackets {depth} deep, over the limit of {MAX_NESTING}: remove the extra brackets"
    )]
    TooDeep { depth: usize },
}

/// Refuses an expression over [`MAX_LENGTH`] bytes or nested deeper than [`MAX_NESTING`].
pub fn check_bounds(expression: &str) -> Result<(), BoundError> {
    if expression.len() > MAX_LENGTH {
        return Err(BoundError::TooLong {
            length: expression.len(),
        });
    }
    let depth = nesting_depth(expression);
    if depth > MAX_NESTING {
        return Err(BoundError::TooDeep { depth });
    }
    Ok(())
}

/// The deepest nesting of brackets outside string literals (`"..."`, `'...'` with backslash
/// escapes, and raw `` `...` ``).
pub fn nesting_depth(expression: &str) -> usize {
    let mut depth: usize = 0;
    let mut deepest: usize = 0;
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for c in expression.chars() {
        if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if c == '\\' && q != '`' {
                escaped = true;
            } else if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            '"' | '\'' | '`' => quote = Some(c),
            '(' | '[' | '{' => {
                depth = depth.saturating_add(1);
                deepest = deepest.max(depth);
            }
            ')' | ']' | '}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brackets_in_string_literals_do_not_count() {
        assert_eq!(nesting_depth("'(((' + `[[[` + \"\\\"(\" + (1)"), 1);
        assert_eq!(nesting_depth("len(result) > 0 && result[0] < 1"), 1);
        assert_eq!(nesting_depth("((1))"), 2);
        assert_eq!(nesting_depth(")))((("), 3);
    }

    #[test]
    fn length_and_depth_limits() {
        let deep = format!("{}1{}", "(".repeat(50_000), ")".repeat(50_000));
        assert_eq!(
            check_bounds(&deep),
            Err(BoundError::TooLong { length: 100_001 })
        );
        let deep = format!("{}1{}", "[".repeat(65), "]".repeat(65));
        assert_eq!(check_bounds(&deep), Err(BoundError::TooDeep { depth: 65 }));
        let fine = format!("{}1{}", "(".repeat(64), ")".repeat(64));
        assert_eq!(check_bounds(&fine), Ok(()));
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(1000))]

            #[test]
            fn any_text_is_within_or_refused(text in "\\PC{0,200}") {
                match check_bounds(&text) {
                    Ok(()) => prop_assert!(nesting_depth(&text) <= MAX_NESTING),
                    Err(BoundError::TooDeep { depth }) => prop_assert!(depth > MAX_NESTING),
                    Err(BoundError::TooLong { length }) => prop_assert!(length > MAX_LENGTH),
                }
            }
        }
    }
}
