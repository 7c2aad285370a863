//! CEL expressions of health checks: compiled once, evaluated on each
//! object a check selects, bound as `object` (the object as the API server
//! serves it, JSON). The environment is CEL's standard library with the
//! strings extension (`lowerAscii`, `split`, `replace`, ...), as
//! Kubernetes offers it, and nothing else: no clock, no I/O.
//!
//! JSON numbers become CEL `int` when they fit in 64 signed bits, else
//! `uint`, else `double` (Kubernetes' own reading of integer fields); the
//! cel-go peer of the differential test reads them the same way.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, LazyLock};

use cel::objects::Key;
use cel::{Context, Env, Program, Value};

/// The name the object is bound to in an expression.
pub const OBJECT: &str = "object";

/// Functions whose results cel-rust and cel-go disagree on (found by the
/// differential test): an expression calling one is refused by the
/// webhook, so no gate depends on which evaluator is right.
pub const REFUSED_FUNCTIONS: &[&str] = &[];

static ENV: LazyLock<Arc<Env>> = LazyLock::new(|| {
    let mut env = Env::stdlib();
    // Registering on a fresh standard environment cannot clash.
    env.add_extension(cel::extensions::strings)
        .expect("the strings extension registers on the standard environment");
    Arc::new(env)
});

/// A health check's expression, compiled.
#[derive(Debug)]
pub struct Expression {
    source: String,
    program: Program,
}

/// An expression that does not compile, or that calls a function refused
/// here.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error("the CEL expression {expression:?} does not parse")]
    Parse {
        expression: String,
        #[source]
        source: cel::ParseErrors,
    },
    #[error(
        "the CEL expression {expression:?} calls {function}, which Ichor's evaluator and cel-go disagree on: write it another way"
    )]
    Refused {
        expression: String,
        function: String,
    },
    #[error("the CEL expression {expression:?} does not use `object`, the object checked")]
    NoObject { expression: String },
}

/// An evaluation that failed (a missing field, no such overload, ...).
#[derive(Debug, thiserror::Error)]
#[error("evaluating the CEL expression {expression:?}")]
pub struct EvalError {
    pub expression: String,
    #[source]
    pub source: cel::ExecutionError,
}

impl Expression {
    /// Parses `source`; refuses what the gates must not depend on.
    pub fn compile(source: &str) -> Result<Self, CompileError> {
        let program = ENV.compile(source).map_err(|e| CompileError::Parse {
            expression: source.to_string(),
            source: e,
        })?;
        let refs = program.references();
        if let Some(f) = REFUSED_FUNCTIONS.iter().find(|f| refs.has_function(f)) {
            return Err(CompileError::Refused {
                expression: source.to_string(),
                function: (*f).to_string(),
            });
        }
        if !refs.has_variable(OBJECT) {
            return Err(CompileError::NoObject {
                expression: source.to_string(),
            });
        }
        Ok(Expression {
            source: source.to_string(),
            program,
        })
    }

    /// As written.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The value of the expression with `object` bound to `object`.
    pub fn evaluate(&self, object: &serde_json::Value) -> Result<Value, EvalError> {
        let mut ctx = Context::with_env(ENV.clone());
        ctx.add_variable_from_value(OBJECT, to_cel(object));
        self.program.execute(&ctx).map_err(|source| EvalError {
            expression: self.source.clone(),
            source,
        })
    }

    /// `None` when `object` passes (the expression is `true` on it);
    /// otherwise the value it had (or why it had none), in words.
    pub fn failing_value(&self, object: &serde_json::Value) -> Option<String> {
        match self.evaluate(object) {
            Ok(Value::Bool(true)) => None,
            Ok(Value::Bool(false)) => Some("false".to_string()),
            Ok(other) => Some(format!("{} (not a bool)", render(&other))),
            Err(e) => Some(format!("error: {}", e.source)),
        }
    }
}

/// A JSON value as CEL sees it (see the module's note on numbers).
pub fn to_cel(v: &serde_json::Value) -> Value {
    match v {
        serde_json::Value::Null => Value::Null,
        serde_json::Value::Bool(b) => Value::Bool(*b),
        serde_json::Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::Int(i)
            } else if let Some(u) = n.as_u64() {
                Value::UInt(u)
            } else {
                Value::Float(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        serde_json::Value::String(s) => Value::String(Arc::new(s.clone())),
        serde_json::Value::Array(items) => {
            Value::List(Arc::new(items.iter().map(to_cel).collect()))
        }
        serde_json::Value::Object(fields) => {
            let map: HashMap<Key, Value> = fields
                .iter()
                .map(|(k, v)| (Key::String(Arc::new(k.clone())), to_cel(v)))
                .collect();
            Value::Map(map.into())
        }
    }
}

/// A CEL value written so that two evaluators' results compare as text:
/// every number tagged with its type (`{"int": 3}`, `{"uint": 3}`, a double
/// by its bits), map keys sorted. The differential test's cel-go peer
/// writes the same form.
pub fn canonical(v: &Value) -> serde_json::Value {
    use serde_json::json;
    match v {
        Value::Null => serde_json::Value::Null,
        Value::Bool(b) => json!(b),
        Value::Int(i) => json!({ "int": i.to_string() }),
        Value::UInt(u) => json!({ "uint": u.to_string() }),
        Value::Float(f) => json!({ "double": double_bits(*f) }),
        Value::String(s) => json!({ "string": s.as_str() }),
        Value::Bytes(b) => {
            json!({ "bytes": b.iter().map(|x| format!("{x:02x}")).collect::<String>() })
        }
        Value::List(items) => json!({ "list": items.iter().map(canonical).collect::<Vec<_>>() }),
        Value::Map(m) => {
            let sorted: BTreeMap<String, serde_json::Value> = m
                .map
                .iter()
                .map(|(k, v)| (key_text(k), canonical(v)))
                .collect();
            json!({ "map": sorted })
        }
        other => json!({ "other": format!("{other:?}") }),
    }
}

/// A double's bits in hex; every NaN is one.
fn double_bits(f: f64) -> String {
    if f.is_nan() {
        "nan".to_string()
    } else {
        format!("{:016x}", f.to_bits())
    }
}

fn key_text(k: &Key) -> String {
    match k {
        Key::Int(i) => format!("int:{i}"),
        Key::Uint(u) => format!("uint:{u}"),
        Key::Bool(b) => format!("bool:{b}"),
        Key::String(s) => format!("string:{s}"),
    }
}

/// A value for a message: short, as CEL would write it.
pub fn render(v: &Value) -> String {
    let text = match v {
        Value::Null => "null".to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Int(i) => i.to_string(),
        Value::UInt(u) => format!("{u}u"),
        Value::Float(f) => f.to_string(),
        Value::String(s) => format!("{:?}", s.as_str()),
        Value::List(items) => format!(
            "[{}]",
            items.iter().map(render).collect::<Vec<_>>().join(", ")
        ),
        Value::Map(m) => {
            let mut fields: Vec<String> = m
                .map
                .iter()
                .map(|(k, v)| format!("{}: {}", key_text(k), render(v)))
                .collect();
            fields.sort();
            format!("{{{}}}", fields.join(", "))
        }
        other => format!("{other:?}"),
    };
    const MAX: usize = 200;
    if text.len() > MAX {
        let cut = (0..=MAX)
            .rev()
            .find(|i| text.is_char_boundary(*i))
            .unwrap_or(0);
        format!("{}…", &text[..cut])
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_deployment_available_passes_and_one_not_yet_says_false() {
        let e = Expression::compile(
            "object.status.conditions.exists(c, c.type == 'Available' && c.status == 'True')",
        )
        .unwrap();
        let up = json!({"status": {"conditions": [{"type": "Available", "status": "True"}]}});
        let down = json!({"status": {"conditions": [{"type": "Available", "status": "False"}]}});
        assert_eq!(e.failing_value(&up), None);
        assert_eq!(e.failing_value(&down), Some("false".to_string()));
        let missing = e.failing_value(&json!({"spec": {}})).unwrap();
        assert!(missing.starts_with("error: "), "{missing}");
    }

    #[test]
    fn numbers_read_as_kubernetes_reads_them() {
        let e = Expression::compile("object.spec.replicas == 3 && object.big > 0u").unwrap();
        let o = json!({"spec": {"replicas": 3}, "big": 18446744073709551615u64});
        assert_eq!(e.failing_value(&o), None);
        assert_eq!(canonical(&to_cel(&json!(3))), json!({"int": "3"}));
        assert_eq!(
            canonical(&to_cel(&json!(1.5))),
            json!({"double": "3ff8000000000000"})
        );
    }

    #[test]
    fn an_expression_that_does_not_parse_or_reads_no_object_is_refused() {
        let e = Expression::compile("object.status.(").unwrap_err();
        assert!(e.to_string().contains("does not parse"), "{e}");
        let e = Expression::compile("1 == 1").unwrap_err();
        assert!(matches!(e, CompileError::NoObject { .. }), "{e}");
    }

    #[test]
    fn a_value_that_is_no_bool_fails_naming_it() {
        let e = Expression::compile("object.spec.replicas").unwrap();
        assert_eq!(
            e.failing_value(&json!({"spec": {"replicas": 2}})),
            Some("2 (not a bool)".to_string())
        );
    }
}
