//! The CEL evaluator of Type rules (DESIGN §15): metered while it runs, and estimated before a
//! rule is accepted.
//!
//! A rule is a tenant's program that every writer of the type makes the server run, so it is
//! the platform's security boundary. [`Evaluator`] walks `cel_parser`'s syntax tree and charges
//! its [`Meter`] for everything it does: one unit per node evaluated, and for every operation
//! that touches more than one thing, a unit per element it touches or per [`BYTES_PER_UNIT`]
//! bytes it reads or makes (a comprehension's every iteration, a list's every compared element,
//! a string's every scanned chunk, a regex's every step of its input times its weight). The
//! meter is checked before the work it pays for, so no rule does more than its budget's worth.
//!
//! [`estimate`] runs the same charges over the schema's bounds instead of values: every list,
//! map, string and bytes field of the data may be as large as a resource allows
//! ([`MAX_DATA_BYTES`]). A comprehension's cost is bounded as `n · body(smallest element) +
//! body(largest element)`: the elements of one resource share its bytes, and every charge is a
//! polynomial with non-negative coefficients in the sizes, so spreading the bytes over many
//! elements never costs more than that. A rule whose estimate exceeds [`RULE_BUDGET`] is
//! refused when its Type is written.
//!
//! Regular expressions are string literals compiled when the Type is written (with a size
//! limit); `matches` with anything else is refused then.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use cel_parser::{ArithmeticOp, Atom, Expression, Member, RelationOp, UnaryOp};
use prost_reflect::{FieldDescriptor, Kind, MessageDescriptor};

/// Units a rule may spend on one resource.
pub(crate) const RULE_BUDGET: u64 = 20_000_000;
/// Units all the rules of one request may spend together.
pub(crate) const REQUEST_BUDGET: u64 = 40_000_000;
/// Bytes read or made per unit.
pub(crate) const BYTES_PER_UNIT: u64 = 16;
/// The most bytes a resource's data may have: every size in an estimate is bounded by it.
pub(crate) const MAX_DATA_BYTES: u64 = crate::resource::DEFAULT_MAX_RESOURCE_BYTES as u64;
/// Data this small, under rules whose worst case on it is at most [`INLINE_UNITS`], is checked
/// where the request is handled: the work is bounded and smaller than a hop to the pool.
pub(crate) const SMALL_DATA_BYTES: u64 = 8 * 1024;
/// See [`SMALL_DATA_BYTES`]: at most a millisecond or two of one core at the measured cost of
/// a unit.
pub(crate) const INLINE_UNITS: u64 = 50_000;
/// The largest compiled regex program.
const REGEX_SIZE_LIMIT: usize = 256 * 1024;

/// A CEL value. Messages are maps from proto field names.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Value {
    Null,
    Bool(bool),
    Int(i64),
    Uint(u64),
    Double(f64),
    String(Arc<str>),
    Bytes(Arc<[u8]>),
    List(Arc<Vec<Value>>),
    Map(Arc<BTreeMap<Key, Value>>),
}

/// A map key.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Key {
    Bool(bool),
    Int(i64),
    Uint(u64),
    String(Arc<str>),
}

impl Value {
    pub(crate) fn type_name(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Uint(_) => "uint",
            Value::Double(_) => "double",
            Value::String(_) => "string",
            Value::Bytes(_) => "bytes",
            Value::List(_) => "list",
            Value::Map(_) => "map",
        }
    }

    /// A value from JSON (what the data's message serializes to): integers as `int` (or `uint`
    /// above `i64::MAX`), other numbers as `double`. Converted with an explicit stack.
    pub(crate) fn from_json(json: &serde_json::Value) -> Value {
        enum Frame<'a> {
            Visit(&'a serde_json::Value),
            List(usize),
            Map(Vec<&'a str>),
        }
        let mut work = vec![Frame::Visit(json)];
        let mut done: Vec<Value> = Vec::new();
        while let Some(frame) = work.pop() {
            match frame {
                Frame::Visit(json) => match json {
                    serde_json::Value::Null => done.push(Value::Null),
                    serde_json::Value::Bool(b) => done.push(Value::Bool(*b)),
                    serde_json::Value::Number(n) => done.push(if let Some(i) = n.as_i64() {
                        Value::Int(i)
                    } else if let Some(u) = n.as_u64() {
                        Value::Uint(u)
                    } else {
                        Value::Double(n.as_f64().unwrap_or(f64::NAN))
                    }),
                    serde_json::Value::String(s) => done.push(Value::String(s.as_str().into())),
                    serde_json::Value::Array(items) => {
                        work.push(Frame::List(items.len()));
                        work.extend(items.iter().rev().map(Frame::Visit));
                    }
                    serde_json::Value::Object(fields) => {
                        work.push(Frame::Map(fields.keys().map(String::as_str).collect()));
                        work.extend(fields.values().rev().map(Frame::Visit));
                    }
                },
                Frame::List(n) => {
                    let items = done.split_off(done.len() - n);
                    done.push(Value::List(Arc::new(items)));
                }
                Frame::Map(keys) => {
                    let values = done.split_off(done.len() - keys.len());
                    let map = keys
                        .into_iter()
                        .zip(values)
                        .map(|(k, v)| (Key::String(k.into()), v))
                        .collect();
                    done.push(Value::Map(Arc::new(map)));
                }
            }
        }
        done.pop().unwrap_or(Value::Null)
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Null => f.write_str("null"),
            Value::Bool(b) => write!(f, "{b}"),
            Value::Int(i) => write!(f, "{i}"),
            Value::Uint(u) => write!(f, "{u}u"),
            Value::Double(d) => f.write_str(&format_double(*d)),
            Value::String(s) => write!(f, "{:?}", truncate(s, 64)),
            Value::Bytes(b) => write!(f, "bytes({})", b.len()),
            Value::List(l) => write!(f, "list({})", l.len()),
            Value::Map(m) => write!(f, "map({})", m.len()),
        }
    }
}

fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Why an evaluation stopped without a value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum EvalError {
    /// The meter ran out: the rule did more work than its budget allows.
    #[error("over its cost budget ({limit} units)")]
    OverBudget { limit: u64 },
    /// The rule is wrong for this data (a type mismatch, a missing key, a division by zero).
    #[error("{0}")]
    Runtime(String),
}

fn runtime(message: impl Into<String>) -> EvalError {
    EvalError::Runtime(message.into())
}

/// Counts the units spent against a limit.
#[derive(Debug, Clone)]
pub(crate) struct Meter {
    used: u64,
    limit: u64,
}

impl Meter {
    pub(crate) fn new(limit: u64) -> Meter {
        Meter { used: 0, limit }
    }

    pub(crate) fn used(&self) -> u64 {
        self.used
    }

    /// Units still to spend.
    pub(crate) fn left(&self) -> u64 {
        self.limit.saturating_sub(self.used)
    }

    /// Records units spent elsewhere (by a rule's own meter).
    pub(crate) fn spend(&mut self, units: u64) {
        self.used = self.used.saturating_add(units);
    }

    /// Pays for work about to be done; refuses when the budget would be exceeded.
    pub(crate) fn charge(&mut self, units: u64) -> Result<(), EvalError> {
        self.used = self.used.saturating_add(units);
        if self.used > self.limit {
            Err(EvalError::OverBudget { limit: self.limit })
        } else {
            Ok(())
        }
    }
}

/// Units for `bytes` bytes read or made.
fn byte_units(bytes: usize) -> u64 {
    (bytes as u64).div_ceil(BYTES_PER_UNIT)
}

/// Key comparisons a map of `entries` may make to find or place one key (its depth as a
/// balanced tree): each may read the whole key, so a key's bytes are paid this many times.
fn key_depth(entries: u64) -> u64 {
    u64::from(64 - entries.leading_zeros()).max(1)
}

/// Parses a rule's or a conversion's text. The parser panics on some inputs it should refuse
/// (an unknown escape in a string literal, `'\\w'`): that panic is caught here and refused as
/// what it is, so no text reaches a node's threads (or raft apply) as a crash.
pub(crate) fn parse(text: &str) -> Result<Expression, String> {
    match std::panic::catch_unwind(|| cel_parser::parse(text)) {
        Ok(Ok(expression)) => Ok(expression),
        Ok(Err(error)) => Err(format!("{} at {}", error.msg, error.span)),
        Err(panic) => {
            let why = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("the parser refused it");
            Err(if why.contains("InvalidEscape") {
                "a string literal holds an escape CEL does not know (write a backslash as \\\\, e.g. '\\\\w' in a pattern)".to_owned()
            } else {
                format!("the text cannot be parsed ({why})")
            })
        }
    }
}

/// A regex compiled when its Type is written, with the weight of one step of its matcher.
#[derive(Debug)]
pub(crate) struct Pattern {
    regex: regex::Regex,
    /// What one byte of input may cost, in byte-units: the most threads the matcher may run
    /// at once (the pattern's positions with repetitions counted out, a class as one), plus its
    /// text's length for the empty moves between them. Measured at most 4.5 ns per weight and
    /// byte on adversarial input (`cost_per_unit`), so [`Pattern::units`] stays within a unit's
    /// worst cost.
    weight: u64,
}

impl Pattern {
    fn compile(pattern: &str) -> Result<Self, String> {
        let regex = regex::RegexBuilder::new(pattern)
            .size_limit(REGEX_SIZE_LIMIT)
            .dfa_size_limit(REGEX_SIZE_LIMIT)
            .nest_limit(32)
            .build()
            .map_err(|error| format!("pattern {pattern:?} is not valid: {error}"))?;
        let hir = regex_syntax::ParserBuilder::new()
            .nest_limit(32)
            .build()
            .parse(pattern)
            .map_err(|error| format!("pattern {pattern:?} is not valid: {error}"))?;
        let weight = 1u64
            .saturating_add(positions(&hir))
            .saturating_add((pattern.len() as u64).div_ceil(8));
        Ok(Self { regex, weight })
    }

    /// Units for matching `len` bytes.
    fn units(&self, len: u64) -> u64 {
        len.saturating_add(1)
            .saturating_mul(self.weight)
            .div_ceil(REGEX_BYTES_PER_UNIT)
    }
}

/// Byte-weights a unit pays for when matching (8 × 4.5 ns: within a unit's measured worst).
const REGEX_BYTES_PER_UNIT: u64 = 8;

/// The threads a backtracking-free matcher may run at once for `hir`: its literal bytes and
/// classes, each repetition counted as many times as it may repeat when bounded (once more than
/// its minimum when not).
fn positions(hir: &regex_syntax::hir::Hir) -> u64 {
    use regex_syntax::hir::HirKind;
    match hir.kind() {
        HirKind::Empty | HirKind::Look(_) => 0,
        HirKind::Literal(literal) => literal.0.len() as u64,
        HirKind::Class(_) => 1,
        HirKind::Repetition(repetition) => {
            let times = repetition
                .max
                .unwrap_or(repetition.min.saturating_add(1))
                .max(1);
            positions(&repetition.sub).saturating_mul(u64::from(times))
        }
        HirKind::Capture(capture) => positions(&capture.sub),
        HirKind::Concat(items) | HirKind::Alternation(items) => {
            items.iter().map(positions).fold(0, u64::saturating_add)
        }
    }
}

/// A rule checked and ready to run: its expression, its compiled regexes and its estimate.
#[derive(Debug)]
pub(crate) struct Program {
    pub expression: Expression,
    regexes: HashMap<String, Pattern>,
    /// The worst case the estimate found, in units.
    pub estimate: u64,
    /// The worst case on data of at most [`SMALL_DATA_BYTES`].
    pub small_estimate: u64,
}

/// Functions a rule may call, and the macros (`has` and the comprehensions).
const FUNCTIONS: [&str; 22] = [
    "size",
    "contains",
    "startsWith",
    "endsWith",
    "matches",
    "int",
    "uint",
    "double",
    "string",
    "bool",
    "bytes",
    "lowerAscii",
    "upperAscii",
    "trim",
    "split",
    "join",
    "has",
    "all",
    "exists",
    "exists_one",
    "map",
    "filter",
];
const COMPREHENSIONS: [&str; 5] = ["all", "exists", "exists_one", "map", "filter"];

/// Checks what cannot be seen from the syntax alone (functions are known, `matches` takes a
/// literal, comprehension variables are identifiers, identifiers are bound), compiles the
/// regexes and estimates the worst case over `message`'s bounds. `expression` must already be
/// known to nest no deeper than the caller allows (this recurses once per level).
pub(crate) fn prepare(
    expression: Expression,
    message: &MessageDescriptor,
    has_old: bool,
) -> Result<Program, String> {
    let mut regexes = HashMap::new();
    let mut bound: Vec<String> = vec!["self".into()];
    if has_old {
        bound.push("old".into());
    }
    check(&expression, &mut bound, &mut regexes)?;
    let estimate = estimate_with(&expression, message, has_old, &regexes, MAX_DATA_BYTES);
    let small_estimate = estimate_with(&expression, message, has_old, &regexes, SMALL_DATA_BYTES);
    Ok(Program {
        expression,
        regexes,
        estimate,
        small_estimate,
    })
}

/// [`prepare`] of an expression over `variables` of no known schema (an admission policy's
/// `object`, `old_object`, `params`, `request`): each may be as large as a resource allows.
pub(crate) fn prepare_over(expression: Expression, variables: &[&str]) -> Result<Program, String> {
    let mut regexes = HashMap::new();
    let mut bound: Vec<String> = variables.iter().map(|v| (*v).to_owned()).collect();
    check(&expression, &mut bound, &mut regexes)?;
    let estimate_at = |bytes: u64| {
        let previous = DATA_BYTES.with(|cell| cell.replace(bytes));
        let mut estimator = Estimator {
            vars: variables
                .iter()
                .map(|v| ((*v).to_owned(), Shape::any()))
                .collect(),
            regexes: &regexes,
        };
        let (_, estimate) = estimator.estimate(&expression);
        DATA_BYTES.with(|cell| cell.set(previous));
        estimate
    };
    let estimate = estimate_at(MAX_DATA_BYTES);
    let small_estimate = estimate_at(SMALL_DATA_BYTES);
    Ok(Program {
        expression,
        regexes,
        estimate,
        small_estimate,
    })
}

fn check(
    e: &Expression,
    bound: &mut Vec<String>,
    regexes: &mut HashMap<String, Pattern>,
) -> Result<(), String> {
    match e {
        Expression::Arithmetic(a, _, b)
        | Expression::Relation(a, _, b)
        | Expression::Or(a, b)
        | Expression::And(a, b) => {
            check(a, bound, regexes)?;
            check(b, bound, regexes)
        }
        Expression::Ternary(a, b, c) => {
            check(a, bound, regexes)?;
            check(b, bound, regexes)?;
            check(c, bound, regexes)
        }
        Expression::Unary(_, a) => check(a, bound, regexes),
        Expression::Member(target, member) => {
            check(target, bound, regexes)?;
            match member.as_ref() {
                Member::Attribute(_) => Ok(()),
                Member::Index(index) => check(index, bound, regexes),
                Member::Fields(_) => Err("message construction (`T{…}`) is not supported".into()),
            }
        }
        Expression::FunctionCall(function, target, arguments) => {
            let Expression::Ident(name) = function.as_ref() else {
                return Err("only named functions can be called".into());
            };
            let name = name.as_str();
            if !FUNCTIONS.contains(&name) {
                return Err(format!(
                    "unknown function {name:?}; rules may call {}",
                    FUNCTIONS.join(", ")
                ));
            }
            if let Some(target) = target {
                check(target, bound, regexes)?;
            }
            if COMPREHENSIONS.contains(&name) {
                let variable = match (target, arguments.as_slice()) {
                    (Some(_), [Expression::Ident(v), _]) => v,
                    (Some(_), [Expression::Ident(v), _, _]) if name == "map" => v,
                    _ => {
                        return Err(format!(
                            "{name} is a macro: LIST.{name}(variable, expression)"
                        ));
                    }
                };
                bound.push(variable.to_string());
                let checked = arguments[1..]
                    .iter()
                    .try_for_each(|a| check(a, bound, regexes));
                bound.pop();
                return checked;
            }
            if name == "has" {
                return match (target, arguments.as_slice()) {
                    (None, [Expression::Member(inner, member)])
                        if matches!(member.as_ref(), Member::Attribute(_)) =>
                    {
                        check(inner, bound, regexes)
                    }
                    _ => Err("has() takes a field selection: has(self.field)".into()),
                };
            }
            if name == "matches" {
                let pattern = match (target, arguments.as_slice()) {
                    (Some(_), [Expression::Atom(Atom::String(p))])
                    | (None, [_, Expression::Atom(Atom::String(p))]) => p,
                    _ => {
                        return Err(
                            "matches() takes a string literal as its pattern (patterns are compiled when the Type is written, never taken from data)"
                                .into(),
                        );
                    }
                };
                if !regexes.contains_key(pattern.as_str()) {
                    regexes.insert(pattern.to_string(), Pattern::compile(pattern)?);
                }
            }
            arguments.iter().try_for_each(|a| check(a, bound, regexes))
        }
        Expression::List(items) => items.iter().try_for_each(|a| check(a, bound, regexes)),
        Expression::Map(entries) => entries.iter().try_for_each(|(k, v)| {
            check(k, bound, regexes)?;
            check(v, bound, regexes)
        }),
        Expression::Atom(_) => Ok(()),
        Expression::Ident(name) => {
            if bound.iter().any(|b| b == name.as_str()) {
                Ok(())
            } else if name.as_str() == "old" {
                Err("`old` is only bound on updates; this rule reads it where it is not".into())
            } else {
                Err(format!(
                    "unknown name {name:?}: rules read `self` (and `old` on an update)"
                ))
            }
        }
    }
}

/// Runs programs against one set of variables, charging one meter.
pub(crate) struct Evaluator<'a> {
    program: &'a Program,
    vars: Vec<(Arc<String>, Value)>,
    meter: &'a mut Meter,
}

impl<'a> Evaluator<'a> {
    pub(crate) fn new(
        program: &'a Program,
        variables: Vec<(Arc<String>, Value)>,
        meter: &'a mut Meter,
    ) -> Self {
        Evaluator {
            program,
            vars: variables,
            meter,
        }
    }

    /// Evaluates the program.
    pub(crate) fn run(&mut self) -> Result<Value, EvalError> {
        let program = self.program;
        self.eval(&program.expression)
    }

    fn lookup(&self, name: &str) -> Result<Value, EvalError> {
        self.vars
            .iter()
            .rev()
            .find(|(n, _)| n.as_str() == name)
            .map(|(_, v)| v.clone())
            .ok_or_else(|| runtime(format!("no variable {name}")))
    }

    fn eval(&mut self, e: &Expression) -> Result<Value, EvalError> {
        self.meter.charge(1)?;
        match e {
            Expression::Atom(atom) => Ok(match atom {
                // A literal is copied each time it is evaluated: its bytes are paid for.
                Atom::String(s) => {
                    self.meter.charge(byte_units(s.len()))?;
                    Value::String(s.as_str().into())
                }
                Atom::Bytes(b) => {
                    self.meter.charge(byte_units(b.len()))?;
                    Value::Bytes(b.as_slice().into())
                }
                Atom::Int(i) => Value::Int(*i),
                Atom::UInt(u) => Value::Uint(*u),
                Atom::Float(f) => Value::Double(*f),
                Atom::Bool(b) => Value::Bool(*b),
                Atom::Null => Value::Null,
            }),
            Expression::Ident(name) => self.lookup(name),
            Expression::And(a, b) => self.logic(a, b, false),
            Expression::Or(a, b) => self.logic(a, b, true),
            Expression::Ternary(c, a, b) => match self.eval(c)? {
                Value::Bool(true) => self.eval(a),
                Value::Bool(false) => self.eval(b),
                other => Err(runtime(format!(
                    "a condition must be a bool, not {}",
                    other.type_name()
                ))),
            },
            Expression::Unary(op, a) => {
                let value = self.eval(a)?;
                match (op, value) {
                    (UnaryOp::Not, Value::Bool(b)) => Ok(Value::Bool(!b)),
                    (UnaryOp::DoubleNot, Value::Bool(b)) => Ok(Value::Bool(b)),
                    (UnaryOp::Minus, Value::Int(i)) => i
                        .checked_neg()
                        .map(Value::Int)
                        .ok_or_else(|| runtime("integer overflow")),
                    (UnaryOp::Minus, Value::Double(d)) => Ok(Value::Double(-d)),
                    (UnaryOp::DoubleMinus, v @ (Value::Int(_) | Value::Double(_))) => Ok(v),
                    (op, v) => Err(runtime(format!(
                        "{op:?} does not apply to {}",
                        v.type_name()
                    ))),
                }
            }
            Expression::Arithmetic(a, op, b) => {
                let a = self.eval(a)?;
                let b = self.eval(b)?;
                self.arithmetic(a, op, b)
            }
            Expression::Relation(a, op, b) => {
                let a = self.eval(a)?;
                let b = self.eval(b)?;
                self.relation(a, op, b)
            }
            Expression::Member(target, member) => {
                let target = self.eval(target)?;
                match member.as_ref() {
                    Member::Attribute(name) => match &target {
                        Value::Map(map) => {
                            self.meter.charge(byte_units(name.len()))?;
                            map.get(&Key::String(name.as_str().into()))
                                .cloned()
                                .ok_or_else(|| runtime(format!("no such key: {name}")))
                        }
                        other => Err(runtime(format!(
                            "cannot select .{name} from {}",
                            other.type_name()
                        ))),
                    },
                    Member::Index(index) => {
                        let index = self.eval(index)?;
                        self.index(&target, &index)
                    }
                    Member::Fields(_) => Err(runtime("message construction is not supported")),
                }
            }
            Expression::List(items) => {
                self.meter.charge(items.len() as u64)?;
                let values = items
                    .iter()
                    .map(|item| self.eval(item))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Value::List(Arc::new(values)))
            }
            Expression::Map(entries) => {
                self.meter.charge(entries.len() as u64)?;
                let mut map = BTreeMap::new();
                let depth = key_depth(entries.len() as u64);
                for (k, v) in entries {
                    let key = to_key(self.eval(k)?)?;
                    if let Key::String(s) = &key {
                        self.meter
                            .charge(byte_units(s.len()).saturating_mul(depth))?;
                    }
                    let value = self.eval(v)?;
                    map.insert(key, value);
                }
                Ok(Value::Map(Arc::new(map)))
            }
            Expression::FunctionCall(function, target, arguments) => {
                let Expression::Ident(name) = function.as_ref() else {
                    return Err(runtime("only named functions can be called"));
                };
                self.call(name, target.as_deref(), arguments)
            }
        }
    }

    /// `&&` (`or` false) and `||` (`or` true), commutative as in CEL: a side that decides wins
    /// over an error on the other.
    fn logic(&mut self, a: &Expression, b: &Expression, or: bool) -> Result<Value, EvalError> {
        let left = match self.eval(a) {
            Ok(Value::Bool(v)) if v == or => return Ok(Value::Bool(or)),
            Ok(Value::Bool(_)) => Ok(()),
            Ok(other) => Err(runtime(format!(
                "{} needs bools, not {}",
                if or { "||" } else { "&&" },
                other.type_name()
            ))),
            Err(over @ EvalError::OverBudget { .. }) => return Err(over),
            Err(error) => Err(error),
        };
        match self.eval(b)? {
            Value::Bool(v) if v == or => Ok(Value::Bool(or)),
            Value::Bool(v) => left.map(|()| Value::Bool(v)),
            other => Err(runtime(format!(
                "{} needs bools, not {}",
                if or { "||" } else { "&&" },
                other.type_name()
            ))),
        }
    }

    fn arithmetic(&mut self, a: Value, op: &ArithmeticOp, b: Value) -> Result<Value, EvalError> {
        use ArithmeticOp as Op;
        // Integers of one sign: checked, an error (never a wrap or a panic) when out of range.
        macro_rules! checked {
            ($a:expr, $b:expr, $wrap:path) => {
                match op {
                    Op::Add => $a.checked_add($b),
                    Op::Subtract => $a.checked_sub($b),
                    Op::Multiply => $a.checked_mul($b),
                    Op::Divide if $b == 0 => return Err(runtime("division by zero")),
                    Op::Divide => $a.checked_div($b),
                    Op::Modulus if $b == 0 => return Err(runtime("modulus by zero")),
                    Op::Modulus => $a.checked_rem($b),
                }
                .map($wrap)
                .ok_or_else(|| runtime("integer overflow"))
            };
        }
        match (a, b) {
            (Value::Int(a), Value::Int(b)) => checked!(a, b, Value::Int),
            (Value::Uint(a), Value::Uint(b)) => checked!(a, b, Value::Uint),
            (Value::Double(a), Value::Double(b)) => Ok(Value::Double(match op {
                Op::Add => a + b,
                Op::Subtract => a - b,
                Op::Multiply => a * b,
                Op::Divide => a / b,
                Op::Modulus => return Err(runtime("% does not apply to doubles")),
            })),
            (Value::String(a), Value::String(b)) if matches!(op, Op::Add) => {
                self.meter.charge(byte_units(a.len() + b.len()))?;
                Ok(Value::String(format!("{a}{b}").into()))
            }
            (Value::Bytes(a), Value::Bytes(b)) if matches!(op, Op::Add) => {
                self.meter.charge(byte_units(a.len() + b.len()))?;
                Ok(Value::Bytes([&a[..], &b[..]].concat().into()))
            }
            (Value::List(a), Value::List(b)) if matches!(op, Op::Add) => {
                self.meter.charge((a.len() + b.len()) as u64)?;
                let mut joined = Vec::with_capacity(a.len() + b.len());
                joined.extend(a.iter().cloned());
                joined.extend(b.iter().cloned());
                Ok(Value::List(Arc::new(joined)))
            }
            (a, b) => Err(runtime(format!(
                "{op:?} does not apply to {} and {}",
                a.type_name(),
                b.type_name()
            ))),
        }
    }

    fn relation(&mut self, a: Value, op: &RelationOp, b: Value) -> Result<Value, EvalError> {
        use std::cmp::Ordering;
        let ordered = |ordering: Ordering| match op {
            RelationOp::LessThan => ordering == Ordering::Less,
            RelationOp::LessThanEq => ordering != Ordering::Greater,
            RelationOp::GreaterThan => ordering == Ordering::Greater,
            RelationOp::GreaterThanEq => ordering != Ordering::Less,
            RelationOp::Equals => ordering == Ordering::Equal,
            RelationOp::NotEquals => ordering != Ordering::Equal,
            RelationOp::In => false,
        };
        match op {
            RelationOp::Equals => Ok(Value::Bool(self.equal(&a, &b)?)),
            RelationOp::NotEquals => Ok(Value::Bool(!self.equal(&a, &b)?)),
            RelationOp::In => match &b {
                Value::List(items) => {
                    for item in items.iter() {
                        self.meter.charge(1)?;
                        if self.equal(&a, item)? {
                            return Ok(Value::Bool(true));
                        }
                    }
                    Ok(Value::Bool(false))
                }
                Value::Map(map) => {
                    if let Value::String(s) = &a {
                        self.meter.charge(
                            byte_units(s.len()).saturating_mul(key_depth(map.len() as u64)),
                        )?;
                    }
                    Ok(Value::Bool(lookup_key(map, &a).is_some()))
                }
                other => Err(runtime(format!(
                    "`in` needs a list or a map, not {}",
                    other.type_name()
                ))),
            },
            _ => {
                let ordering = self.compare(&a, &b)?;
                Ok(Value::Bool(ordered(ordering)))
            }
        }
    }

    fn compare(&mut self, a: &Value, b: &Value) -> Result<std::cmp::Ordering, EvalError> {
        match (a, b) {
            (Value::String(a), Value::String(b)) => {
                self.meter.charge(byte_units(a.len().min(b.len())))?;
                Ok(a.cmp(b))
            }
            (Value::Bytes(a), Value::Bytes(b)) => {
                self.meter.charge(byte_units(a.len().min(b.len())))?;
                Ok(a.cmp(b))
            }
            (Value::Bool(a), Value::Bool(b)) => Ok(a.cmp(b)),
            _ => match numeric_cmp(a, b) {
                Some(Some(ordering)) => Ok(ordering),
                Some(None) => Err(runtime("NaN cannot be ordered")),
                None => Err(runtime(format!(
                    "{} and {} cannot be ordered",
                    a.type_name(),
                    b.type_name()
                ))),
            },
        }
    }

    /// Equality, charging for every element and chunk compared.
    fn equal(&mut self, a: &Value, b: &Value) -> Result<bool, EvalError> {
        match (a, b) {
            (Value::String(a), Value::String(b)) => {
                self.meter.charge(byte_units(a.len().min(b.len())))?;
                Ok(a == b)
            }
            (Value::Bytes(a), Value::Bytes(b)) => {
                self.meter.charge(byte_units(a.len().min(b.len())))?;
                Ok(a == b)
            }
            (Value::List(a), Value::List(b)) => {
                if a.len() != b.len() {
                    return Ok(false);
                }
                for (x, y) in a.iter().zip(b.iter()) {
                    self.meter.charge(1)?;
                    if !self.equal(x, y)? {
                        return Ok(false);
                    }
                }
                Ok(true)
            }
            (Value::Map(a), Value::Map(b)) => {
                if a.len() != b.len() {
                    return Ok(false);
                }
                for ((k1, v1), (k2, v2)) in a.iter().zip(b.iter()) {
                    // Comparing keys reads them.
                    let key_bytes = match (k1, k2) {
                        (Key::String(x), Key::String(y)) => x.len().min(y.len()),
                        _ => 0,
                    };
                    self.meter.charge(1 + byte_units(key_bytes))?;
                    if k1 != k2 || !self.equal(v1, v2)? {
                        return Ok(false);
                    }
                }
                Ok(true)
            }
            (Value::Null, Value::Null) => Ok(true),
            (Value::Bool(a), Value::Bool(b)) => Ok(a == b),
            _ => Ok(matches!(
                numeric_cmp(a, b),
                Some(Some(std::cmp::Ordering::Equal))
            )),
        }
    }

    fn index(&mut self, target: &Value, index: &Value) -> Result<Value, EvalError> {
        match target {
            Value::List(items) => {
                let i = match index {
                    Value::Int(i) => usize::try_from(*i).ok(),
                    Value::Uint(u) => usize::try_from(*u).ok(),
                    Value::Double(d) if d.fract() == 0.0 && *d >= 0.0 => Some(*d as usize),
                    other => {
                        return Err(runtime(format!(
                            "a list is indexed by an int, not {}",
                            other.type_name()
                        )));
                    }
                };
                i.and_then(|i| items.get(i))
                    .cloned()
                    .ok_or_else(|| runtime(format!("index {index} out of range")))
            }
            Value::Map(map) => {
                if let Value::String(s) = index {
                    self.meter
                        .charge(byte_units(s.len()).saturating_mul(key_depth(map.len() as u64)))?;
                }
                lookup_key(map, index)
                    .cloned()
                    .ok_or_else(|| runtime(format!("no such key: {index}")))
            }
            other => Err(runtime(format!("{} cannot be indexed", other.type_name()))),
        }
    }

    fn call(
        &mut self,
        name: &str,
        target: Option<&Expression>,
        arguments: &[Expression],
    ) -> Result<Value, EvalError> {
        if COMPREHENSIONS.contains(&name) {
            let (Some(range), [Expression::Ident(variable), rest @ ..]) = (target, arguments)
            else {
                return Err(runtime(format!("{name} is a macro: LIST.{name}(x, e)")));
            };
            let range = self.eval(range)?;
            return self.comprehension(name, range, variable, rest);
        }
        if name == "has" {
            let [Expression::Member(inner, member)] = arguments else {
                return Err(runtime("has() takes a field selection"));
            };
            let Member::Attribute(field) = member.as_ref() else {
                return Err(runtime("has() takes a field selection"));
            };
            let inner = self.eval(inner)?;
            self.meter.charge(byte_units(field.len()))?;
            return match inner {
                Value::Map(map) => Ok(Value::Bool(
                    map.contains_key(&Key::String(field.as_str().into())),
                )),
                other => Err(runtime(format!(
                    "has() selects from a message or map, not {}",
                    other.type_name()
                ))),
            };
        }
        let mut values = Vec::with_capacity(arguments.len() + 1);
        if let Some(target) = target {
            values.push(self.eval(target)?);
        }
        for argument in arguments {
            values.push(self.eval(argument)?);
        }
        match (name, values.as_slice()) {
            ("size", [v]) => match v {
                Value::String(s) => {
                    self.meter.charge(byte_units(s.len()))?;
                    Ok(Value::Int(s.chars().count() as i64))
                }
                Value::Bytes(b) => Ok(Value::Int(b.len() as i64)),
                Value::List(l) => Ok(Value::Int(l.len() as i64)),
                Value::Map(m) => Ok(Value::Int(m.len() as i64)),
                other => Err(runtime(format!("size() of {}", other.type_name()))),
            },
            ("contains" | "startsWith" | "endsWith", [Value::String(s), Value::String(p)]) => {
                self.meter.charge(byte_units(s.len() + p.len()))?;
                Ok(Value::Bool(match name {
                    "contains" => s.contains(&**p),
                    "startsWith" => s.starts_with(&**p),
                    _ => s.ends_with(&**p),
                }))
            }
            ("matches", [Value::String(s), Value::String(p)]) => {
                let pattern =
                    self.program.regexes.get(&**p).ok_or_else(|| {
                        runtime("matches() takes a pattern compiled with the Type")
                    })?;
                self.meter.charge(pattern.units(s.len() as u64))?;
                Ok(Value::Bool(pattern.regex.is_match(s)))
            }
            ("lowerAscii" | "upperAscii" | "trim", [Value::String(s)]) => {
                self.meter.charge(byte_units(s.len()))?;
                Ok(Value::String(match name {
                    "lowerAscii" => s.to_ascii_lowercase().into(),
                    "upperAscii" => s.to_ascii_uppercase().into(),
                    _ => s.trim().into(),
                }))
            }
            ("split", [Value::String(s), Value::String(separator)]) => {
                self.meter.charge(byte_units(s.len() + separator.len()))?;
                if separator.is_empty() {
                    return Err(runtime("split() needs a separator that is not empty"));
                }
                let parts: Vec<Value> = s
                    .split(&**separator)
                    .map(|part| Value::String(part.into()))
                    .collect();
                self.meter.charge(parts.len() as u64)?;
                Ok(Value::List(Arc::new(parts)))
            }
            ("join", [Value::List(items), rest @ ..]) if rest.len() <= 1 => {
                let separator = match rest {
                    [Value::String(s)] => s.to_string(),
                    [] => String::new(),
                    _ => return Err(runtime("join() takes a string separator")),
                };
                let mut total = separator.len() * items.len();
                for item in items.iter() {
                    match item {
                        Value::String(s) => total += s.len(),
                        other => {
                            return Err(runtime(format!(
                                "join() joins strings, not {}",
                                other.type_name()
                            )));
                        }
                    }
                }
                self.meter.charge(items.len() as u64 + byte_units(total))?;
                let parts: Vec<&str> = items
                    .iter()
                    .map(|item| match item {
                        Value::String(s) => &**s,
                        _ => "",
                    })
                    .collect();
                Ok(Value::String(parts.join(&separator).into()))
            }
            ("int" | "uint" | "double" | "string" | "bool" | "bytes", [v]) => {
                if let Value::String(s) = v {
                    self.meter.charge(byte_units(s.len()))?;
                }
                if let Value::Bytes(b) = v {
                    self.meter.charge(byte_units(b.len()))?;
                }
                convert(name, v)
            }
            (name, values) => Err(runtime(format!(
                "{name}() does not take ({})",
                values
                    .iter()
                    .map(Value::type_name)
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }

    fn comprehension(
        &mut self,
        name: &str,
        range: Value,
        variable: &Arc<String>,
        rest: &[Expression],
    ) -> Result<Value, EvalError> {
        // Lists are iterated in place; a map's keys are copied out (a unit each).
        let keys: Vec<Value>;
        let items: &[Value] = match &range {
            Value::List(items) => items,
            Value::Map(map) => {
                self.meter.charge(map.len() as u64)?;
                keys = map.keys().map(key_value).collect();
                &keys
            }
            other => {
                return Err(runtime(format!(
                    "{name}() iterates a list or a map, not {}",
                    other.type_name()
                )));
            }
        };
        let mut kept = Vec::new();
        let mut count = 0usize;
        let mut error = None;
        for item in items {
            self.meter.charge(1)?;
            self.vars.push((variable.clone(), item.clone()));
            let outcome = self.iteration(name, rest);
            self.vars.pop();
            let outcome = match outcome {
                Ok(Some(outcome)) => outcome,
                Ok(None) => continue,
                Err(over @ EvalError::OverBudget { .. }) => return Err(over),
                // all/exists decide on any false/true, errors elsewhere notwithstanding.
                Err(e) if matches!(name, "all" | "exists") => {
                    error.get_or_insert(e);
                    continue;
                }
                Err(e) => return Err(e),
            };
            match (name, outcome) {
                ("all", Value::Bool(false)) => return Ok(Value::Bool(false)),
                ("exists", Value::Bool(true)) => return Ok(Value::Bool(true)),
                ("all" | "exists", Value::Bool(_)) => {}
                ("exists_one", Value::Bool(b)) => count += usize::from(b),
                ("filter", Value::Bool(true)) => kept.push(item.clone()),
                ("filter", Value::Bool(false)) => {}
                ("map", value) => kept.push(value),
                (_, other) => {
                    return Err(runtime(format!(
                        "{name}() needs a bool from its expression, not {}",
                        other.type_name()
                    )));
                }
            }
        }
        if let Some(error) = error {
            return Err(error);
        }
        Ok(match name {
            "all" => Value::Bool(true),
            "exists" => Value::Bool(false),
            "exists_one" => Value::Bool(count == 1),
            _ => Value::List(Arc::new(kept)),
        })
    }

    /// One iteration's value: for `map` with a filter (`map(x, p, e)`), `e` only where `p`
    /// (`None` where not).
    fn iteration(&mut self, name: &str, rest: &[Expression]) -> Result<Option<Value>, EvalError> {
        match rest {
            [body] => self.eval(body).map(Some),
            [predicate, body] if name == "map" => match self.eval(predicate)? {
                Value::Bool(true) => self.eval(body).map(Some),
                Value::Bool(false) => Ok(None),
                other => Err(runtime(format!(
                    "map()'s filter must be a bool, not {}",
                    other.type_name()
                ))),
            },
            _ => Err(runtime(format!(
                "{name}() takes a variable and an expression"
            ))),
        }
    }
}

fn key_value(key: &Key) -> Value {
    match key {
        Key::Bool(b) => Value::Bool(*b),
        Key::Int(i) => Value::Int(*i),
        Key::Uint(u) => Value::Uint(*u),
        Key::String(s) => Value::String(s.clone()),
    }
}

fn to_key(value: Value) -> Result<Key, EvalError> {
    match value {
        Value::Bool(b) => Ok(Key::Bool(b)),
        Value::Int(i) => Ok(Key::Int(i)),
        Value::Uint(u) => Ok(Key::Uint(u)),
        Value::String(s) => Ok(Key::String(s)),
        other => Err(runtime(format!(
            "a map key is a bool, int, uint or string, not {}",
            other.type_name()
        ))),
    }
}

/// A key's entry, `int` and `uint` keys of the same number being the same key.
fn lookup_key<'m>(map: &'m BTreeMap<Key, Value>, key: &Value) -> Option<&'m Value> {
    match key {
        Value::Int(i) => map
            .get(&Key::Int(*i))
            .or_else(|| u64::try_from(*i).ok().and_then(|u| map.get(&Key::Uint(u)))),
        Value::Uint(u) => map
            .get(&Key::Uint(*u))
            .or_else(|| i64::try_from(*u).ok().and_then(|i| map.get(&Key::Int(i)))),
        Value::Bool(b) => map.get(&Key::Bool(*b)),
        Value::String(s) => map.get(&Key::String(s.clone())),
        _ => None,
    }
}

/// Orders two numbers of any numeric types (`Some(None)` for NaN, `None` if not both numbers).
fn numeric_cmp(a: &Value, b: &Value) -> Option<Option<std::cmp::Ordering>> {
    use Value::{Double, Int, Uint};
    Some(match (a, b) {
        (Int(a), Int(b)) => Some(a.cmp(b)),
        (Uint(a), Uint(b)) => Some(a.cmp(b)),
        (Int(a), Uint(b)) => Some(i128::from(*a).cmp(&i128::from(*b))),
        (Uint(a), Int(b)) => Some(i128::from(*a).cmp(&i128::from(*b))),
        (Double(a), Double(b)) => a.partial_cmp(b),
        (Int(a), Double(b)) => (*a as f64).partial_cmp(b),
        (Double(a), Int(b)) => a.partial_cmp(&(*b as f64)),
        (Uint(a), Double(b)) => (*a as f64).partial_cmp(b),
        (Double(a), Uint(b)) => a.partial_cmp(&(*b as f64)),
        _ => return None,
    })
}

fn convert(name: &str, v: &Value) -> Result<Value, EvalError> {
    let bad = || runtime(format!("{name}() cannot convert {} {v}", v.type_name()));
    Ok(match (name, v) {
        ("int", Value::Int(i)) => Value::Int(*i),
        ("int", Value::Uint(u)) => Value::Int(i64::try_from(*u).map_err(|_| bad())?),
        ("int", Value::Double(d)) if d.is_finite() && d.abs() < 9.2e18 => Value::Int(*d as i64),
        ("int", Value::String(s)) => Value::Int(s.parse().map_err(|_| bad())?),
        ("uint", Value::Uint(u)) => Value::Uint(*u),
        ("uint", Value::Int(i)) => Value::Uint(u64::try_from(*i).map_err(|_| bad())?),
        ("uint", Value::Double(d)) if d.is_finite() && *d >= 0.0 && *d < 1.8e19 => {
            Value::Uint(*d as u64)
        }
        ("uint", Value::String(s)) => Value::Uint(s.parse().map_err(|_| bad())?),
        ("double", Value::Double(d)) => Value::Double(*d),
        ("double", Value::Int(i)) => Value::Double(*i as f64),
        ("double", Value::Uint(u)) => Value::Double(*u as f64),
        ("double", Value::String(s)) => Value::Double(s.parse().map_err(|_| bad())?),
        ("string", Value::String(s)) => Value::String(s.clone()),
        ("string", Value::Int(i)) => Value::String(i.to_string().into()),
        ("string", Value::Uint(u)) => Value::String(u.to_string().into()),
        ("string", Value::Double(d)) => Value::String(format_double(*d).into()),
        ("string", Value::Bool(b)) => Value::String(b.to_string().into()),
        ("string", Value::Bytes(b)) => Value::String(
            std::str::from_utf8(b)
                .map_err(|_| runtime("string() of bytes that are not UTF-8"))?
                .into(),
        ),
        ("bool", Value::Bool(b)) => Value::Bool(*b),
        ("bool", Value::String(s)) => Value::Bool(match &**s {
            "true" | "TRUE" | "True" | "t" | "1" => true,
            "false" | "FALSE" | "False" | "f" | "0" => false,
            _ => return Err(bad()),
        }),
        ("bytes", Value::Bytes(b)) => Value::Bytes(b.clone()),
        ("bytes", Value::String(s)) => Value::Bytes(s.as_bytes().into()),
        _ => return Err(bad()),
    })
}

/// A double as CEL's reference implementation writes it (Go's `%g` with the shortest digits
/// that read back the same: `1e+300`, `1.5e-07`, `123456.5`): never more than 24 bytes, where
/// Rust's positional `Display` writes 309 digits for `1e308`.
fn format_double(d: f64) -> String {
    if d.is_nan() {
        return "NaN".into();
    }
    if d.is_infinite() {
        return if d > 0.0 { "+Inf" } else { "-Inf" }.into();
    }
    // Shortest digits, as `m.mmme±x`.
    let scientific = format!("{d:e}");
    let (mantissa, exponent) = scientific
        .split_once('e')
        .unwrap_or((scientific.as_str(), "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    if d != 0.0 && !(-4..6).contains(&exponent) {
        let sign = if exponent < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exponent.unsigned_abs())
    } else {
        format!("{d}")
    }
}

// ---------------------------------------------------------------------------------------------
// The estimate.

thread_local! {
    /// The largest resource the estimate running on this thread assumes (its data's bytes bound
    /// every list, map and string): [`MAX_DATA_BYTES`] for the budget check,
    /// [`SMALL_DATA_BYTES`] for the inline check.
    static DATA_BYTES: std::cell::Cell<u64> = const { std::cell::Cell::new(MAX_DATA_BYTES) };
}

fn data_bytes() -> u64 {
    DATA_BYTES.with(std::cell::Cell::get)
}

thread_local! {
    /// The longest field name of the schema the estimate on this thread runs over (see
    /// [`longest_field_name`]), found once per estimate.
    static LONGEST_NAME: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// [`Estimator::estimate`] of `expression` over data of at most `bytes` bytes.
fn estimate_with(
    expression: &Expression,
    message: &MessageDescriptor,
    has_old: bool,
    regexes: &HashMap<String, Pattern>,
    bytes: u64,
) -> u64 {
    let previous = DATA_BYTES.with(|cell| cell.replace(bytes));
    let previous_name = LONGEST_NAME.with(|cell| cell.replace(longest_field_name(message)));
    let root = Shape::message(message.clone(), Scale::Large);
    let mut estimator = Estimator {
        vars: vec![("self".into(), root.clone())],
        regexes,
    };
    if has_old {
        estimator.vars.push(("old".into(), root));
    }
    let (_, estimate) = estimator.estimate(expression);
    DATA_BYTES.with(|cell| cell.set(previous));
    LONGEST_NAME.with(|cell| cell.set(previous_name));
    estimate
}

/// Whether a shape stands for its largest or its smallest instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scale {
    Large,
    Small,
}

/// What the estimate knows of a value: how large it may be (bytes of a string, elements of a
/// list or map), and what its parts are.
#[derive(Debug, Clone)]
struct Shape {
    /// Bytes (strings, bytes) or elements (lists, maps); 0 for scalars.
    size: u64,
    /// A list's elements, or a map's values.
    element: Option<Arc<Shape>>,
    /// A map's keys.
    key: Option<Arc<Shape>>,
    /// A message's fields, by name.
    message: Option<(MessageDescriptor, Scale)>,
    /// Every element may be as large as `element` at once: they do not share the data's bytes
    /// (a literal list naming the same long string, what `map` makes from outside its element).
    repeated: bool,
}

impl Shape {
    fn scalar() -> Shape {
        Shape {
            size: 0,
            element: None,
            key: None,
            message: None,
            repeated: false,
        }
    }

    /// This shape with every element as large as `element` at once.
    fn repeated(self, repeated: bool) -> Shape {
        Shape { repeated, ..self }
    }

    /// Whether this value may hold the data's bytes even when what it was made from is as
    /// small as can be (then many of them do not share those bytes).
    fn holds_data(&self) -> bool {
        match &self.message {
            Some((_, scale)) => matches!(scale, Scale::Large),
            None => self.size > 0,
        }
    }

    fn bytes(size: u64) -> Shape {
        Shape {
            size,
            ..Shape::scalar()
        }
    }

    /// Anything at all, as large as data may make it.
    fn any() -> Shape {
        let leaf = Arc::new(Shape::bytes(data_bytes()));
        Shape {
            size: data_bytes(),
            element: Some(leaf.clone()),
            key: Some(leaf),
            ..Shape::scalar()
        }
    }

    fn message(descriptor: MessageDescriptor, scale: Scale) -> Shape {
        Shape {
            size: descriptor.fields().len() as u64,
            message: Some((descriptor.clone(), scale)),
            ..Shape::scalar()
        }
    }

    fn list(size: u64, element: Shape) -> Shape {
        Shape {
            size,
            element: Some(Arc::new(element)),
            ..Shape::scalar()
        }
    }

    /// The smallest instance of this shape (what each of many elements may be).
    fn smallest(&self) -> Shape {
        match &self.message {
            Some((descriptor, _)) => Shape::message(descriptor.clone(), Scale::Small),
            None => Shape {
                size: 0,
                element: self.element.as_ref().map(|e| Arc::new(e.smallest())),
                key: self.key.as_ref().map(|k| Arc::new(k.smallest())),
                ..Shape::scalar()
            },
        }
    }

    /// The shape of field `name` of this message shape, or of any value for other shapes.
    fn field(&self, name: &str) -> Shape {
        let Some((descriptor, scale)) = &self.message else {
            return self.element.as_deref().cloned().unwrap_or_else(Shape::any);
        };
        match descriptor.get_field_by_name(name) {
            Some(field) => field_shape(&field, *scale),
            None => Shape::any(),
        }
    }

    fn element(&self) -> Shape {
        self.element.as_deref().cloned().unwrap_or_else(Shape::any)
    }

    fn iterated(&self) -> Shape {
        if self.key.is_some() {
            self.key.as_deref().cloned().unwrap_or_else(Shape::any)
        } else {
            self.element()
        }
    }
}

/// Encoded bytes an element of this kind takes at least (its tag included, unpacked).
fn min_element_bytes(kind: &Kind) -> u64 {
    match kind {
        Kind::Fixed32 | Kind::Sfixed32 | Kind::Float => 4,
        Kind::Fixed64 | Kind::Sfixed64 | Kind::Double => 8,
        // Packed varints take one byte each.
        Kind::Int32
        | Kind::Int64
        | Kind::Uint32
        | Kind::Uint64
        | Kind::Sint32
        | Kind::Sint64
        | Kind::Bool
        | Kind::Enum(_) => 1,
        // A tag and a length.
        Kind::String | Kind::Bytes | Kind::Message(_) => 2,
    }
}

/// How a field reads in a rule (as JSON renders it), and how large it may be.
fn field_shape(field: &FieldDescriptor, scale: Scale) -> Shape {
    let budget = match scale {
        Scale::Large => data_bytes(),
        Scale::Small => 0,
    };
    let single = |kind: &Kind| -> Shape {
        match kind {
            Kind::String => Shape::bytes(budget),
            // Base64.
            Kind::Bytes => Shape::bytes(budget.saturating_mul(4) / 3 + 4),
            Kind::Enum(e) => {
                Shape::bytes(e.values().map(|v| v.name().len() as u64).max().unwrap_or(0))
            }
            Kind::Message(m) => match m.full_name() {
                "google.protobuf.Timestamp" | "google.protobuf.Duration" => Shape::bytes(40),
                "google.protobuf.FieldMask" => Shape::bytes(budget),
                "google.protobuf.Struct"
                | "google.protobuf.Value"
                | "google.protobuf.ListValue"
                | "google.protobuf.Any" => match scale {
                    Scale::Large => Shape::any(),
                    Scale::Small => Shape::any().smallest(),
                },
                name if name.starts_with("google.protobuf.") && name.ends_with("Value") => {
                    Shape::bytes(budget)
                }
                _ => Shape::message(m.clone(), scale),
            },
            _ => Shape::scalar(),
        }
    };
    let kind = field.kind();
    if field.is_map() {
        let Kind::Message(entry) = &kind else {
            return Shape::any();
        };
        let key = entry.map_entry_key_field();
        let value = entry.map_entry_value_field();
        return Shape {
            // An entry takes a tag and a length at least (its key and value may be left out).
            size: budget / 2,
            element: Some(Arc::new(single(&value.kind()))),
            key: Some(Arc::new(single(&key.kind()))),
            ..Shape::scalar()
        };
    }
    if field.is_list() {
        return Shape::list(budget / min_element_bytes(&kind), single(&kind));
    }
    single(&kind)
}

struct Estimator<'a> {
    vars: Vec<(String, Shape)>,
    regexes: &'a HashMap<String, Pattern>,
}

impl Estimator<'_> {
    /// The shape of `e`'s value and the most units evaluating it may cost.
    fn estimate(&mut self, e: &Expression) -> (Shape, u64) {
        let (shape, cost) = self.estimate_node(e);
        (shape, cost.saturating_add(1))
    }

    fn estimate_node(&mut self, e: &Expression) -> (Shape, u64) {
        match e {
            Expression::Atom(atom) => match atom {
                Atom::String(s) => (Shape::bytes(s.len() as u64), byte_units_u64(s.len() as u64)),
                Atom::Bytes(b) => (Shape::bytes(b.len() as u64), byte_units_u64(b.len() as u64)),
                _ => (Shape::scalar(), 0),
            },
            Expression::Ident(name) => (
                self.vars
                    .iter()
                    .rev()
                    .find(|(n, _)| n == name.as_str())
                    .map(|(_, s)| s.clone())
                    .unwrap_or_else(Shape::any),
                0,
            ),
            Expression::And(a, b) | Expression::Or(a, b) => {
                let (_, ca) = self.estimate(a);
                let (_, cb) = self.estimate(b);
                (Shape::scalar(), ca.saturating_add(cb))
            }
            Expression::Ternary(c, a, b) => {
                let (_, cc) = self.estimate(c);
                let (sa, ca) = self.estimate(a);
                let (sb, cb) = self.estimate(b);
                (larger(sa, sb), cc.saturating_add(ca.max(cb)))
            }
            Expression::Unary(_, a) => self.estimate(a),
            Expression::Arithmetic(a, op, b) => {
                let (sa, ca) = self.estimate(a);
                let (sb, cb) = self.estimate(b);
                let mut cost = ca.saturating_add(cb);
                let shape = if matches!(op, ArithmeticOp::Add) && (sa.size > 0 || sb.size > 0) {
                    let size = sa.size.saturating_add(sb.size);
                    // Strings and bytes by bytes, lists by elements: the larger charge.
                    cost = cost.saturating_add(size.max(byte_units_u64(size)));
                    Shape {
                        size,
                        element: sa.element.clone().or(sb.element.clone()).map(|e| {
                            Arc::new(larger(
                                (*e).clone(),
                                sb.element.as_deref().cloned().unwrap_or_else(Shape::scalar),
                            ))
                        }),
                        key: None,
                        message: None,
                        repeated: sa.repeated || sb.repeated,
                    }
                } else {
                    Shape::scalar()
                };
                (shape, cost)
            }
            Expression::Relation(a, op, b) => {
                let (sa, ca) = self.estimate(a);
                let (sb, cb) = self.estimate(b);
                let compare = match op {
                    RelationOp::In => {
                        if sb.key.is_some() {
                            byte_units_u64(sa.size).saturating_mul(key_depth(sb.size))
                        } else {
                            sb.size.saturating_mul(1 + equal_cost(&sa, &sb.element()))
                        }
                    }
                    _ => equal_cost(&sa, &sb),
                };
                (
                    Shape::scalar(),
                    ca.saturating_add(cb).saturating_add(compare),
                )
            }
            Expression::Member(target, member) => {
                let (shape, cost) = self.estimate(target);
                match member.as_ref() {
                    Member::Attribute(name) => (
                        shape.field(name),
                        cost.saturating_add(byte_units_u64(name.len() as u64)),
                    ),
                    Member::Index(index) => {
                        let (si, ci) = self.estimate(index);
                        let out = if shape.key.is_some() || shape.message.is_none() {
                            shape.element()
                        } else {
                            Shape::any()
                        };
                        // A map's key is compared down the map's depth.
                        let depth = if shape.key.is_some() || shape.message.is_none() {
                            key_depth(shape.size)
                        } else {
                            1
                        };
                        (
                            out,
                            cost.saturating_add(ci)
                                .saturating_add(byte_units_u64(si.size).saturating_mul(depth)),
                        )
                    }
                    Member::Fields(_) => (Shape::any(), cost),
                }
            }
            Expression::List(items) => {
                let mut cost = items.len() as u64;
                let mut element: Option<Shape> = None;
                for item in items {
                    let (s, c) = self.estimate(item);
                    cost = cost.saturating_add(c);
                    element = Some(match element {
                        Some(e) => larger(e, s),
                        None => s,
                    });
                }
                (
                    Shape::list(items.len() as u64, element.unwrap_or_else(Shape::scalar))
                        .repeated(true),
                    cost,
                )
            }
            Expression::Map(entries) => {
                let mut cost = entries.len() as u64;
                let depth = key_depth(entries.len() as u64);
                let mut key: Option<Shape> = None;
                let mut value: Option<Shape> = None;
                for (k, v) in entries {
                    let (sk, ck) = self.estimate(k);
                    let (sv, cv) = self.estimate(v);
                    cost = cost
                        .saturating_add(ck)
                        .saturating_add(cv)
                        .saturating_add(byte_units_u64(sk.size).saturating_mul(depth));
                    key = Some(key.map_or(sk.clone(), |k| larger(k, sk)));
                    value = Some(value.map_or(sv.clone(), |v| larger(v, sv)));
                }
                (
                    Shape {
                        size: entries.len() as u64,
                        element: Some(Arc::new(value.unwrap_or_else(Shape::scalar))),
                        key: Some(Arc::new(key.unwrap_or_else(Shape::scalar))),
                        message: None,
                        repeated: true,
                    },
                    cost,
                )
            }
            Expression::FunctionCall(function, target, arguments) => {
                let Expression::Ident(name) = function.as_ref() else {
                    return (Shape::any(), u64::MAX);
                };
                self.estimate_call(name, target.as_deref(), arguments)
            }
        }
    }

    fn estimate_call(
        &mut self,
        name: &str,
        target: Option<&Expression>,
        arguments: &[Expression],
    ) -> (Shape, u64) {
        if COMPREHENSIONS.contains(&name) {
            let (Some(range), [Expression::Ident(variable), rest @ ..]) = (target, arguments)
            else {
                return (Shape::any(), u64::MAX);
            };
            let (range, range_cost) = self.estimate(range);
            let n = range.size;
            let element = range.iterated();
            // Many small elements, or one that holds all the bytes (module doc).
            let body = |estimator: &mut Self, shape: Shape| {
                estimator.vars.push((variable.to_string(), shape));
                let mut cost = 0u64;
                let mut out = Shape::scalar();
                for e in rest {
                    let (s, c) = estimator.estimate(e);
                    cost = cost.saturating_add(c);
                    out = s;
                }
                estimator.vars.pop();
                (out, cost)
            };
            let (out_small, small) = body(self, element.smallest());
            let (out, large) = body(self, element.clone());
            let iterations = if range.repeated {
                // Every element may be the largest.
                n.saturating_mul(1u64.saturating_add(large))
            } else {
                n.saturating_mul(1u64.saturating_add(small))
                    .saturating_add(large)
            };
            // A map's keys are copied out.
            let copy = if range.key.is_some() { n } else { 0 };
            let cost = range_cost.saturating_add(copy).saturating_add(iterations);
            let shape = match name {
                // What `map` makes from outside its element is made for every element.
                "map" => Shape::list(n, out).repeated(range.repeated || out_small.holds_data()),
                "filter" => Shape::list(n, element).repeated(range.repeated),
                _ => Shape::scalar(),
            };
            return (shape, cost);
        }
        if name == "has" {
            let cost = match arguments {
                [Expression::Member(inner, member)] => {
                    let name = match member.as_ref() {
                        Member::Attribute(name) => name.len() as u64,
                        _ => 0,
                    };
                    self.estimate(inner).1.saturating_add(byte_units_u64(name))
                }
                _ => u64::MAX,
            };
            return (Shape::scalar(), cost);
        }
        let mut shapes = Vec::new();
        let mut cost = 0u64;
        if let Some(target) = target {
            let (s, c) = self.estimate(target);
            shapes.push(s);
            cost = cost.saturating_add(c);
        }
        for argument in arguments {
            let (s, c) = self.estimate(argument);
            shapes.push(s);
            cost = cost.saturating_add(c);
        }
        let first = shapes.first().map(|s| s.size).unwrap_or(0);
        let total: u64 = shapes.iter().map(|s| s.size).fold(0, u64::saturating_add);
        let (shape, own) = match name {
            "size" => (Shape::scalar(), byte_units_u64(first)),
            "contains" | "startsWith" | "endsWith" => (Shape::scalar(), byte_units_u64(total)),
            "matches" => {
                let pattern = match (target, arguments) {
                    (Some(_), [Expression::Atom(Atom::String(p))])
                    | (None, [_, Expression::Atom(Atom::String(p))]) => p.as_str(),
                    _ => return (Shape::scalar(), u64::MAX),
                };
                match self.regexes.get(pattern) {
                    Some(compiled) => (Shape::scalar(), compiled.units(first)),
                    None => (Shape::scalar(), u64::MAX),
                }
            }
            "lowerAscii" | "upperAscii" | "trim" => (Shape::bytes(first), byte_units_u64(first)),
            "split" => (
                Shape::list(first.saturating_add(1), Shape::bytes(first)),
                byte_units_u64(total).saturating_add(first.saturating_add(1)),
            ),
            "join" => {
                let list = shapes.first().cloned().unwrap_or_else(Shape::any);
                let separator = shapes.get(1).map(|s| s.size).unwrap_or(0);
                let bytes = list
                    .element()
                    .size
                    .saturating_add(separator)
                    .saturating_mul(list.size);
                // Strings of one list share its bytes.
                let bytes =
                    bytes.min(data_bytes().saturating_add(separator.saturating_mul(list.size)));
                (
                    Shape::bytes(bytes),
                    list.size.saturating_add(byte_units_u64(bytes)),
                )
            }
            "string" => (Shape::bytes(first.max(24)), byte_units_u64(first)),
            "bytes" => (Shape::bytes(first), byte_units_u64(first)),
            _ => (Shape::scalar(), byte_units_u64(first)),
        };
        (shape, cost.saturating_add(own))
    }
}

fn byte_units_u64(bytes: u64) -> u64 {
    bytes.div_ceil(BYTES_PER_UNIT)
}

/// The most an equality of two values of these shapes may cost.
fn equal_cost(a: &Shape, b: &Shape) -> u64 {
    let n = a.size.min(b.size);
    if let (Some((_, scale)), Some(_)) = (&a.message, &b.message) {
        // Messages compare field by field, each entry reading its name; below the top level,
        // every byte of the data may be an element or entry of its own (a packed varint is one
        // byte), and strings and bytes (base64) are read whole.
        let entry = 1 + byte_units_u64(LONGEST_NAME.with(std::cell::Cell::get));
        let fields = n.saturating_mul(entry);
        return match scale {
            Scale::Small => fields,
            Scale::Large => fields
                .saturating_add(data_bytes().saturating_mul(entry))
                .saturating_add(byte_units_u64(data_bytes().saturating_mul(2))),
        };
    }
    let keys = match (&a.key, &b.key) {
        (Some(x), Some(y)) => equal_cost(x, y),
        _ => 0,
    };
    match (&a.element, &b.element) {
        (Some(x), Some(y)) => {
            n.saturating_mul(equal_cost(x, y).saturating_add(keys).saturating_add(1))
        }
        _ => byte_units_u64(n),
    }
}

/// The longest name (as JSON writes it) of a field of any message in `descriptor`'s schema.
fn longest_field_name(descriptor: &MessageDescriptor) -> u64 {
    descriptor
        .parent_pool()
        .all_messages()
        .flat_map(|m| m.fields().collect::<Vec<_>>())
        .map(|f| f.name().len().max(f.json_name().len()) as u64)
        .max()
        .unwrap_or(0)
}

/// A shape that bounds both.
fn larger(a: Shape, b: Shape) -> Shape {
    if a.message.is_some() && b.message.is_none() && b.size == 0 {
        return a;
    }
    if b.message.is_some() && a.message.is_none() && a.size == 0 {
        return b;
    }
    let element = match (a.element, b.element) {
        (Some(x), Some(y)) => Some(Arc::new(larger((*x).clone(), (*y).clone()))),
        (x, y) => x.or(y),
    };
    let key = match (a.key, b.key) {
        (Some(x), Some(y)) => Some(Arc::new(larger((*x).clone(), (*y).clone()))),
        (x, y) => x.or(y),
    };
    Shape {
        size: a.size.max(b.size),
        element,
        key,
        message: a.message.or(b.message),
        repeated: a.repeated || b.repeated,
    }
}

#[cfg(test)]
mod tests;
