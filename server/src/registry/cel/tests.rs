//! The evaluator's semantics, its meter and its estimate.

use super::*;
use crate::registry::dynamic::tests::invoice_message;

fn run_with(source: &str, data: serde_json::Value, limit: u64) -> Result<Value, EvalError> {
    let message = invoice_message();
    let expression = cel_parser::parse(source).expect("parses");
    let program = prepare(expression, &message, false).expect("prepares");
    let mut meter = Meter::new(limit);
    Evaluator::new(
        &program,
        vec![(Arc::new("self".to_owned()), Value::from_json(&data))],
        &mut meter,
    )
    .run()
}

fn run(source: &str) -> Result<Value, EvalError> {
    run_with(
        source,
        serde_json::json!({"amount_cents": 5, "customer": "acme", "lines": []}),
        RULE_BUDGET,
    )
}

fn estimate_of(source: &str) -> u64 {
    let expression = cel_parser::parse(source).expect("parses");
    prepare(expression, &invoice_message(), false)
        .expect("prepares")
        .estimate
}

#[test]
fn evaluates_the_language() {
    for (source, expected) in [
        ("1 + 2 * 3 == 7", true),
        ("self.amount_cents >= 0 && self.customer == 'acme'", true),
        (
            "self.customer.startsWith('ac') && self.customer.endsWith('me')",
            true,
        ),
        ("self.customer.contains('cm')", true),
        (
            "size(self.customer) == 4 && self.customer.size() == 4",
            true,
        ),
        ("self.customer.matches('^[a-z]+$')", true),
        ("[1, 2, 3].all(x, x > 0)", true),
        ("[1, 2, 3].exists(x, x == 2)", true),
        ("[1, 2, 3].exists_one(x, x > 2)", true),
        ("[1, 2, 3].map(x, x * 2) == [2, 4, 6]", true),
        ("[1, 2, 3].filter(x, x % 2 == 1) == [1, 3]", true),
        ("[1, 2, 3].map(x, x > 1, x * 10) == [20, 30]", true),
        ("{'a': 1}['a'] == 1 && 'a' in {'a': 1}", true),
        ("2 in [1, 2]", true),
        ("has(self.customer)", true),
        ("self.amount_cents > 3 ? true : false", true),
        ("1u + 2u == 3u && 1 == 1u && 1.0 == 1", true),
        (
            "int('42') == 42 && string(42) == '42' && double(1) == 1.0",
            true,
        ),
        (
            "'a,b'.split(',') == ['a', 'b'] && ['a', 'b'].join('-') == 'a-b'",
            true,
        ),
        ("'  A '.trim().lowerAscii() == 'a'", true),
        ("!(1 > 2)", true),
        // CEL's commutative logic: a deciding side wins over an error on the other.
        ("1 / 0 == 1 || true", true),
        ("false && 1 / 0 == 1", false),
    ] {
        assert_eq!(run(source), Ok(Value::Bool(expected)), "{source}");
    }
}

#[test]
fn errors_are_values_not_panics() {
    for source in [
        "1 / 0 == 0",
        "1 % 0 == 0",
        "9223372036854775807 + 1 > 0",
        "-(-9223372036854775807 - 1) > 0",
        "[1][5] == 1",
        "{'a': 1}['b'] == 1",
        "'a' + 1 == 'a1'",
        "int('x') == 1",
        "self.customer < 1",
    ] {
        assert!(
            matches!(run(source), Err(EvalError::Runtime(_))),
            "{source}: {:?}",
            run(source)
        );
    }
}

#[test]
fn prepare_refuses_what_cannot_be_bounded() {
    let message = invoice_message();
    for (source, says) in [
        ("self.customer.matches(self.currency)", "string literal"),
        ("self.customer.matches('(')", "not valid"),
        ("launch(self)", "unknown function"),
        ("other > 1", "unknown name"),
        ("old.amount_cents > 1", "only bound on updates"),
        ("[1].all(1, true)", "macro"),
    ] {
        let expression = cel_parser::parse(source).expect("parses");
        let error = prepare(expression, &message, false).expect_err(source);
        assert!(error.contains(says), "{source}: {error}");
    }
}

#[test]
fn the_meter_stops_work_at_its_limit() {
    // 300³ iterations: the attack that froze a cluster. Stopped after the budget's units.
    let source = "[1,2,3].map(a, [1,2,3]).all(x, true)";
    assert!(run(source).is_ok());
    let big: Vec<String> = (0..300).map(|i| i.to_string()).collect();
    let list = format!("[{}]", big.join(","));
    let source = format!("{list}.all(a, {list}.all(b, {list}.all(c, a + b + c >= 0)))");
    let started = std::time::Instant::now();
    assert_eq!(
        run_with(&source, serde_json::json!({}), 1_000_000),
        Err(EvalError::OverBudget { limit: 1_000_000 })
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
}

#[test]
fn strings_are_charged_by_their_bytes() {
    let long = "x".repeat(1 << 20);
    let data = serde_json::json!({"customer": long});
    // Reading a megabyte is 65,536 units: over a budget of 60,000, within one of 70,000.
    let source = "self.customer.contains('y')";
    assert!(matches!(
        run_with(source, data.clone(), 60_000),
        Err(EvalError::OverBudget { .. })
    ));
    assert_eq!(run_with(source, data, 70_000), Ok(Value::Bool(false)));
}

/// A map compares a key down its depth, each comparison reading up to the whole key: a
/// megabyte key looked up in a map of 64 entries (depth 7) is paid seven times, and each key a
/// map is built with, its depth times (the keys' common prefix makes every comparison read it).
#[test]
fn map_keys_are_charged_for_every_comparison() {
    let long = "x".repeat(1 << 20);
    let data = serde_json::json!({"customer": long});
    let keys: Vec<String> = (0..63).map(|i| format!("'k{i}': {i}")).collect();
    let map = format!("{{{}, self.customer: 63}}", keys.join(", "));
    let source = format!("self.customer in {map}");
    // The key read (65,536 units) and placed in the map (x7), then looked up (x7): over
    // 800,000 units, where one pass over it each time was about 200,000.
    assert!(matches!(
        run_with(&source, data.clone(), 800_000),
        Err(EvalError::OverBudget { .. })
    ));
    assert_eq!(run_with(&source, data, 1_200_000), Ok(Value::Bool(true)));
    assert!(estimate_of(&source) >= 800_000, "{}", estimate_of(&source));
}

/// `len` letters, each `a` or `b` at random (a fixed seed): text no matcher can skip through.
fn random_ab(len: usize) -> String {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if x & 1 == 0 { 'a' } else { 'b' }
        })
        .collect()
}

/// A regex step costs what its matcher may run at once, not what its text spells:
/// `[ab]*a[ab]{400}c` is 16 bytes, yet on text of `a`s and `b`s about 400 threads run per byte
/// (1.4 µs a byte measured). Its worst case over a resource's longest string is over budget, and
/// on a megabyte of such text the meter stops it long before its seconds of work.
#[test]
fn a_regex_is_paid_for_by_what_its_matcher_runs() {
    let explosive = "self.customer.matches('[ab]*a[ab]{400}c')";
    assert!(
        estimate_of(explosive) > RULE_BUDGET,
        "{}",
        estimate_of(explosive)
    );
    let data = serde_json::json!({"customer": random_ab(1 << 20)});
    // Refused before matching: the charge comes first.
    assert!(matches!(
        run_with(explosive, data, RULE_BUDGET),
        Err(EvalError::OverBudget { .. })
    ));
    // A class is one thread whatever it spans: a Unicode `\w` costs as little as `[a-z]`.
    let word = estimate_of(r"self.customer.matches('^\\w+@\\w+$')");
    let ascii = estimate_of("self.customer.matches('^[a-z]+@[a-z]+$')");
    assert!(word <= ascii + ascii / 2, "{word} vs {ascii}");
    assert!(word < RULE_BUDGET / 4, "{word}");
}

#[test]
fn the_estimate_bounds_what_data_can_make_a_rule_do() {
    // Constant work.
    assert!(estimate_of("self.amount_cents >= 0") < 10);
    // One pass over the largest list a resource can hold fits the budget.
    let one = estimate_of("self.lines.all(l, l.cents >= 0)");
    assert!(one < RULE_BUDGET, "{one}");
    // A pass over a list of strings, reading each: many small ones or one large one.
    let strings = estimate_of("self.lines.all(l, l.item.matches('^[a-z]+$'))");
    assert!(strings < RULE_BUDGET, "{strings}");
    // A comprehension nested over the data's list is quadratic: over any budget.
    assert!(estimate_of("self.lines.all(a, self.lines.all(b, a.cents <= b.cents))") > RULE_BUDGET);
    // Literal lists count their elements: three levels of 300 are 27 million iterations.
    let big: Vec<String> = (0..300).map(|i| i.to_string()).collect();
    let list = format!("[{}]", big.join(","));
    let nested = format!("{list}.all(a, {list}.all(b, {list}.all(c, a + b + c >= 0)))");
    assert!(estimate_of(&nested) > RULE_BUDGET);
    // Strings built in a comprehension cost what they copy.
    assert!(
        estimate_of("size(self.lines.map(l, self.customer + self.customer)) >= 0") > RULE_BUDGET
    );
}

#[test]
fn what_runs_never_costs_more_than_estimated() {
    let lines: Vec<serde_json::Value> = (0..2000)
        .map(|i| serde_json::json!({"item": format!("item{i}"), "cents": i}))
        .collect();
    let data = serde_json::json!({"customer": "x".repeat(5000), "lines": lines, "amount_cents": 1, "currency": "EUR"});
    for source in [
        "self.lines.all(l, l.cents >= 0)",
        "self.lines.exists(l, l.item.matches('^item[0-9]+$') && l.cents > 1999)",
        "self.lines.map(l, l.item + self.currency).size() > 0",
        "self.customer.contains('y') || self.lines.filter(l, l.cents % 2 == 0).size() == 1000",
        "[1, 2, 3].all(x, self.lines.exists(l, l.cents == x))",
    ] {
        let estimate = estimate_of(source);
        let expression = cel_parser::parse(source).expect("parses");
        let program = prepare(expression, &invoice_message(), false).expect("prepares");
        let mut meter = Meter::new(u64::MAX);
        Evaluator::new(
            &program,
            vec![(Arc::new("self".to_owned()), Value::from_json(&data))],
            &mut meter,
        )
        .run()
        .expect("runs");
        assert!(
            meter.used() <= estimate,
            "{source}: used {} > estimated {estimate}",
            meter.used()
        );
    }
}

/// The estimate at the data's own size bounds what runs, where elements do not share the data's
/// bytes: a literal list naming one long string many times, what `map` makes from outside its
/// element, a message equality over a packed list (a byte an element), map keys compared.
/// Each case spent past its estimate before.
#[test]
fn elements_that_do_not_share_the_data_are_estimated_each_at_its_largest() {
    use prost::Message as _;
    let message = packed_message();
    let cases: Vec<(&str, serde_json::Value)> = vec![
        (
            "[self.name, self.name, self.name, self.name, self.name, self.name].all(x, !x.contains('z'))",
            serde_json::json!({"name": "x".repeat(200_000)}),
        ),
        (
            "self.tags.map(t, self.name).all(x, !x.contains('z'))",
            serde_json::json!({"name": "x".repeat(100_000), "tags": vec!["t"; 200]}),
        ),
        (
            "self == self",
            serde_json::json!({"codes": vec![1; 200_000]}),
        ),
        (
            "{self.name: 1} == {self.name: 1}",
            serde_json::json!({"name": "x".repeat(200_000)}),
        ),
    ];
    for (source, json) in cases {
        let dynamic = prost_reflect::DynamicMessage::deserialize(message.clone(), json.clone())
            .expect("data fits");
        let bytes = dynamic.encode_to_vec().len() as u64;
        let expression = cel_parser::parse(source).expect("parses");
        let program = prepare(expression.clone(), &message, false).expect("prepares");
        let estimate = estimate_with(&expression, &message, false, &program.regexes, bytes);
        let mut meter = Meter::new(u64::MAX);
        Evaluator::new(
            &program,
            vec![(Arc::new("self".to_owned()), Value::from_json(&json))],
            &mut meter,
        )
        .run()
        .expect("runs");
        assert!(
            meter.used() <= estimate,
            "{source}: used {} > estimated {estimate} on {bytes} bytes",
            meter.used()
        );
    }
    // Comparing two maps reads their keys: 12,500 units for each of the two 200 KB keys placed
    // and as much again to compare them (the comparison was free).
    let data = serde_json::json!({"name": "x".repeat(200_000)});
    let expression = cel_parser::parse("{self.name: 1} == {self.name: 1}").expect("parses");
    let program = prepare(expression, &message, false).expect("prepares");
    let mut meter = Meter::new(u64::MAX);
    Evaluator::new(
        &program,
        vec![(Arc::new("self".to_owned()), Value::from_json(&data))],
        &mut meter,
    )
    .run()
    .expect("runs");
    assert!(meter.used() >= 37_500, "{}", meter.used());
}

/// A double is written in at most 24 bytes, as CEL's reference implementation writes it.
#[test]
fn doubles_are_written_short() {
    for (source, expected) in [
        ("string(1e300) == '1e+300'", true),
        ("string(1.5e-7) == '1.5e-07'", true),
        ("string(123456.5) == '123456.5'", true),
        ("string(1000000.0) == '1e+06'", true),
        ("string(0.0001) == '0.0001'", true),
        ("size(string(-1.2345678901234567e-308)) <= 24", true),
        ("string(0.0) == '0'", true),
    ] {
        assert_eq!(run(source), Ok(Value::Bool(expected)), "{source}");
    }
}

/// A message with a packed list of numbers, a string and a list of strings.
fn packed_message() -> MessageDescriptor {
    let mut t = crate::registry::dynamic::tests::invoice_type();
    t.rules.clear();
    t.defaults.clear();
    t.kind = "Packed".into();
    t.proto = "syntax = \"proto3\";\npackage resd.payments.v1;\nmessage Packed {\n  repeated int64 codes = 1;\n  string name = 2;\n  repeated string tags = 3;\n}\n".into();
    let compiled = crate::registry::dynamic::compile(&t).expect("compiles");
    crate::registry::dynamic::CompiledType::load(&compiled)
        .expect("loads")
        .message
}

mod properties {
    //! Random rules over random invoices: evaluation never panics, never spends more than its
    //! meter allows, never more than the rule's estimate when the estimate is within budget, and
    //! takes time in proportion to the units it spends.

    use proptest::prelude::*;

    use super::*;

    fn atom() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("self.amount_cents".to_owned()),
            Just("self.customer".to_owned()),
            Just("self.currency".to_owned()),
            Just("self.lines".to_owned()),
            Just("self.billing.city".to_owned()),
            Just("self.status".to_owned()),
            Just("x".to_owned()),
            Just("x.item".to_owned()),
            Just("x.cents".to_owned()),
            (-5i64..50).prop_map(|i| i.to_string()),
            "[a-c]{0,3}".prop_map(|s| format!("'{s}'")),
            Just("[1, 2, 3]".to_owned()),
            Just("{'a': 1, 'b': 2}".to_owned()),
            Just("true".to_owned()),
            Just("null".to_owned()),
        ]
    }

    fn expression() -> impl Strategy<Value = String> {
        atom().prop_recursive(5, 48, 3, |inner| {
            prop_oneof![
                (
                    inner.clone(),
                    inner.clone(),
                    prop_oneof![
                        Just("+"),
                        Just("-"),
                        Just("*"),
                        Just("/"),
                        Just("%"),
                        Just("=="),
                        Just("!="),
                        Just("<"),
                        Just(">="),
                        Just("&&"),
                        Just("||"),
                        Just("in"),
                    ]
                )
                    .prop_map(|(a, b, op)| format!("({a} {op} {b})")),
                (inner.clone(), inner.clone(), inner.clone())
                    .prop_map(|(c, a, b)| format!("({c} ? {a} : {b})")),
                (
                    inner.clone(),
                    prop_oneof![
                        Just("size"),
                        Just("string"),
                        Just("int"),
                        Just("lowerAscii"),
                    ]
                )
                    .prop_map(|(a, f)| if f == "lowerAscii" {
                        format!("{a}.lowerAscii()")
                    } else {
                        format!("{f}({a})")
                    }),
                (
                    inner.clone(),
                    inner.clone(),
                    prop_oneof![
                        Just("all"),
                        Just("exists"),
                        Just("exists_one"),
                        Just("map"),
                        Just("filter"),
                    ]
                )
                    .prop_map(|(range, body, m)| format!("{range}.{m}(x, {body})")),
                (
                    inner.clone(),
                    prop_oneof![Just("all"), Just("exists_one"), Just("map")]
                )
                    .prop_map(|(body, m)| format!("self.lines.{m}(x, {body})")),
                (
                    inner.clone(),
                    inner.clone(),
                    prop_oneof![Just("contains"), Just("startsWith"), Just("endsWith"),]
                )
                    .prop_map(|(a, b, f)| format!("{a}.{f}({b})")),
                inner
                    .clone()
                    .prop_map(|a| format!("{a}.matches('^(a|b)*c[0-9]+$')")),
                inner.clone().prop_map(|a| format!("!{a}")),
                inner.prop_map(|a| format!("has(self.billing) && {a} != null")),
            ]
        })
    }

    fn invoice() -> impl Strategy<Value = serde_json::Value> {
        (
            any::<i64>(),
            "[a-z ]{0,2000}",
            prop::collection::vec(("[a-c0-9]{0,40}", -100i64..100), 0..400),
        )
            .prop_map(|(amount, customer, lines)| {
                let lines: Vec<serde_json::Value> = lines
                    .into_iter()
                    .map(|(item, cents)| serde_json::json!({"item": item, "cents": cents}))
                    .collect();
                serde_json::json!({
                    "amount_cents": amount,
                    "customer": customer,
                    "currency": "EUR",
                    "lines": lines,
                    "billing": {"city": "Lyon"},
                    "status": "STATUS_OPEN",
                })
            })
    }

    /// The slowest a unit was seen to take, in nanoseconds (reported by the last case).
    static SLOWEST_UNIT_NS: std::sync::Mutex<(f64, u64)> = std::sync::Mutex::new((0.0, 0));

    proptest! {
        #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

        #[test]
        fn random_rules_stay_within_their_budget(source in expression(), data in invoice()) {
            let Ok(expression) = cel_parser::parse(&source) else { return Ok(()); };
            let Ok(program) = prepare(expression, &invoice_message(), false) else {
                return Ok(());
            };
            let limit = RULE_BUDGET;
            let mut meter = Meter::new(limit);
            let value = Value::from_json(&data);
            let started = std::time::Instant::now();
            let outcome = Evaluator::new(
                &program,
                vec![(Arc::new("self".to_owned()), value)],
                &mut meter,
            )
            .run();
            let elapsed = started.elapsed();
            let used = meter.used();
            match outcome {
                Err(EvalError::OverBudget { .. }) => prop_assert!(used > limit),
                _ => prop_assert!(used <= limit),
            }
            if program.estimate <= limit {
                prop_assert!(
                    used <= program.estimate,
                    "{source}: used {used} units, estimated {}", program.estimate
                );
            }
            // Unmetered work shows as time out of proportion to the units (a loose bound:
            // this is a debug build on a shared machine, not a benchmark).
            prop_assert!(
                elapsed <= std::time::Duration::from_millis(500)
                    + std::time::Duration::from_nanos(used.saturating_mul(20_000)),
                "{source}: {used} units took {elapsed:?}"
            );
            if used >= 5_000 {
                let per_unit = elapsed.as_nanos() as f64 / used as f64;
                let mut slowest = SLOWEST_UNIT_NS.lock().unwrap_or_else(|p| p.into_inner());
                if per_unit > slowest.0 {
                    *slowest = (per_unit, used);
                    eprintln!("slowest unit so far: {per_unit:.1} ns ({used} units: {source})");
                }
            }
        }
    }
}

/// The costliest shapes of work per unit, each run near the rule budget: what a unit costs at
/// worst (`cargo test --release -p server --lib cost_per_unit -- --ignored --nocapture`).
#[test]
#[ignore = "a measurement: run in release"]
fn cost_per_unit() {
    let lines: Vec<serde_json::Value> = (0..20_000)
        .map(|i| serde_json::json!({"item": format!("item{i}"), "cents": i % 7}))
        .collect();
    let data = serde_json::json!({
        "customer": random_ab(1 << 21),
        "currency": "EUR",
        "lines": lines,
    });
    let value = Value::from_json(&data);
    for source in [
        "self.lines.all(x, self.lines.exists(y, x.cents == y.cents + 100))",
        "self.lines.map(x, x.item + x.item).size() > 0",
        "self.lines.filter(x, x.cents in [1, 2, 3]).size() > 0",
        "self.lines.all(x, self.customer.contains('zz'))",
        "self.lines.all(x, self.customer.matches('^(a|b)*c$'))",
        "self.customer.matches('[ab]*a[ab]{400}c')",
        "self.customer.matches('[ab]*a[ab]{40}c')",
        "self.lines.all(x, self.customer == self.customer + 'x')",
        "self.lines.all(x, self.lines == self.lines)",
        "self.lines.all(x, size(self.customer) > 0)",
        "self.lines.all(x, string(x.cents).lowerAscii().split('1').size() >= 0)",
    ] {
        let expression = cel_parser::parse(source).expect("parses");
        let program = prepare(expression, &invoice_message(), false).expect("prepares");
        let mut meter = Meter::new(RULE_BUDGET);
        let started = std::time::Instant::now();
        let _ = Evaluator::new(
            &program,
            vec![(Arc::new("self".to_owned()), value.clone())],
            &mut meter,
        )
        .run();
        let elapsed = started.elapsed();
        eprintln!(
            "{:>8.1} ns/unit  {:>9} units  {:>8.1?}  {source}",
            elapsed.as_nanos() as f64 / meter.used() as f64,
            meter.used(),
            elapsed
        );
    }
}
