//! Compiling Types, their rules and defaults, and what an update may change.

use super::*;

/// A change to a Type, and what its refusal must say.
type Change = Box<dyn Fn(&mut pb::Type)>;

pub(crate) const INVOICE: &str = r#"
syntax = "proto3";
package resd.payments.v1;

import "google/protobuf/timestamp.proto";

// An invoice a customer owes.
message Invoice {
  // What is owed, in cents.
  int64 amount_cents = 1;
  // ISO 4217 code.
  string currency = 2;
  string customer = 3;
  repeated Line lines = 4;
  Address billing = 5;
  google.protobuf.Timestamp due = 6;
  Status status = 7;
}

message Line {
  string item = 1;
  int64 cents = 2;
}

message Address {
  string city = 1;
}

enum Status {
  STATUS_UNSPECIFIED = 0;
  STATUS_OPEN = 1;
  STATUS_PAID = 2;
}
"#;

pub(crate) fn invoice_type() -> pb::Type {
    pb::Type {
        group: "payments".into(),
        group_version: "v1".into(),
        kind: "Invoice".into(),
        scope: pb::Scope::Namespace as i32,
        description: "Invoices".into(),
        proto: INVOICE.into(),
        descriptor_set: Vec::new(),
        rules: vec![
            pb::Rule {
                expression: "self.amount_cents >= 0".into(),
                message: "amount_cents must not be negative".into(),
                field: "amount_cents".into(),
            },
            pb::Rule {
                expression: "self.lines.all(l, l.cents >= 0)".into(),
                message: "every line's cents must not be negative".into(),
                field: "lines".into(),
            },
        ],
        defaults: vec![pb::Default {
            field: "currency".into(),
            value: "\"EUR\"".into(),
        }],
        ..Default::default()
    }
}

fn data(compiled: &CompiledType, json: serde_json::Value) -> Vec<u8> {
    DynamicMessage::deserialize(compiled.message.clone(), json)
        .expect("valid data")
        .encode_to_vec()
}

fn decoded(compiled: &CompiledType, bytes: &[u8]) -> serde_json::Value {
    DynamicMessage::decode(compiled.message.clone(), bytes)
        .expect("decodes")
        .serialize_with_options(
            serde_json::value::Serializer,
            &SerializeOptions::new().use_proto_field_name(true),
        )
        .expect("serializes")
}

/// A stored `registry.v1.Type` resource named `name` at `version`, created with `uid`.
pub(crate) fn stored(
    name: &str,
    version: &str,
    uid: &str,
    t: &pb::Type,
) -> proto::resource::v1::Resource {
    proto::resource::v1::Resource {
        id: Some(proto::resource::v1::Id {
            uid: uid.into(),
            name: name.into(),
            r#type: Some(crate::registry::builtin::registry_type()),
            tenancy: Some(Default::default()),
        }),
        version: version.into(),
        data: Some(proto::to_any(t)),
        ..Default::default()
    }
}

fn load(t: &pb::Type) -> CompiledType {
    CompiledType::load(&compile(t).expect("compiles")).expect("loads")
}

#[test]
fn a_type_compiles_and_its_rules_and_defaults_apply() {
    let stored = compile(&invoice_type()).expect("compiles");
    assert!(!stored.descriptor_set.is_empty());
    let compiled = CompiledType::load(&stored).expect("loads");
    assert_eq!(compiled.message.full_name(), "resd.payments.v1.Invoice");
    assert_eq!(compiled.scope, Scope::Namespace);

    // The default fills an unset currency, and leaves a set one alone.
    let bare = data(&compiled, serde_json::json!({"amountCents": 1200}));
    let filled = compiled
        .apply_defaults(&bare)
        .expect("defaults")
        .expect("changed");
    assert_eq!(decoded(&compiled, &filled)["currency"], "EUR");
    let usd = data(&compiled, serde_json::json!({"currency": "USD"}));
    assert_eq!(compiled.apply_defaults(&usd).expect("defaults"), None);

    // Rules.
    rules(&compiled, &filled, None).expect("valid");
    let negative = data(&compiled, serde_json::json!({"amountCents": -5}));
    let error = rules(&compiled, &negative, None).expect_err("negative");
    assert!(
        error.contains("resource.data.amount_cents: amount_cents must not be negative"),
        "{error}"
    );
    let bad_line = data(
        &compiled,
        serde_json::json!({"amountCents": 5, "lines": [{"item": "a", "cents": 3}, {"item": "b", "cents": -1}]}),
    );
    let error = rules(&compiled, &bad_line, None).expect_err("bad line");
    assert!(error.contains("every line's cents"), "{error}");
}

#[test]
fn transition_rules_see_the_stored_data() {
    let mut t = invoice_type();
    t.rules.push(pb::Rule {
        expression: "self.amount_cents >= old.amount_cents".into(),
        message: "amount_cents may only grow".into(),
        field: String::new(),
    });
    let compiled = load(&t);
    assert!(compiled.has_transition_rules());
    let low = data(&compiled, serde_json::json!({"amountCents": 5}));
    let high = data(&compiled, serde_json::json!({"amountCents": 9}));
    // On create (no old) only the others run.
    rules(&compiled, &low, None).expect("create");
    rules(&compiled, &high, Some(&low)).expect("grows");
    let error = rules(&compiled, &low, Some(&high)).expect_err("shrinks");
    assert!(
        error.contains("resource.data: amount_cents may only grow"),
        "{error}"
    );
}

#[test]
fn bad_types_are_refused_naming_what_is_wrong() {
    let cases: Vec<(Change, &str)> = vec![
        (
            Box::new(|t| {
                t.proto = "syntax = \"proto3\";\npackage resd.payments.v1;\nmessage Invoice { int64 amount_cents = 1 }\n".into()
            }),
            "Invoice.proto:3:",
        ),
        (
            Box::new(|t| t.proto = t.proto.replace("resd.payments.v1", "resd.billing.v1")),
            "must declare `package resd.payments.v1;`",
        ),
        (Box::new(|t| t.kind = "Bill".into()), "has no message Bill"),
        (
            Box::new(|t| {
                t.proto = t
                    .proto
                    .replace("google/protobuf/timestamp.proto", "team/secret.proto")
            }),
            "team/secret.proto",
        ),
        (
            Box::new(|t| t.group = "acl".into()),
            "reserved for built-in types",
        ),
        (Box::new(|t| t.scope = 0), "data.scope is required"),
        (
            Box::new(|t| t.proto = "x".repeat(MAX_SCHEMA_BYTES + 1)),
            "at most 1048576",
        ),
        (
            Box::new(|t| t.rules[0].expression = "self.amount_cents >=".into()),
            "data.rules[0].expression",
        ),
        (
            // The parser panics on an escape it does not know; refused, not a crash.
            Box::new(|t| t.rules[0].expression = r"self.customer.matches('^\w+$')".into()),
            "an escape CEL does not know",
        ),
        (
            Box::new(|t| t.rules[0].expression = "self.amount > 0".into()),
            "unknown fields: amount of resd.payments.v1.Invoice",
        ),
        (
            Box::new(|t| t.rules[0].expression = "self.billing.town == ''".into()),
            "town of resd.payments.v1.Address",
        ),
        (
            Box::new(|t| t.rules[0].field = "amount".into()),
            "data.rules[0].field",
        ),
        (
            Box::new(|t| t.rules[0].message = String::new()),
            "data.rules[0].message is required",
        ),
        (
            Box::new(|t| t.rules = vec![t.rules[0].clone(); MAX_RULES + 1]),
            "at most 64",
        ),
        (
            Box::new(|t| t.defaults[0].value = "42".into()),
            "does not fit field currency",
        ),
        (
            Box::new(|t| t.defaults[0].value = "EUR".into()),
            "is not JSON",
        ),
        (
            Box::new(|t| t.defaults[0].field = "money".into()),
            "has no such field",
        ),
    ];
    for (change, needle) in cases {
        let mut t = invoice_type();
        change(&mut t);
        let error = compile(&t).expect_err(needle);
        assert!(error.contains(needle), "{needle:?} in {error}");
    }
}

#[test]
fn updates_stay_wire_compatible() {
    let old = load(&invoice_type());
    // Added fields, enum values and rules are fine.
    let mut grown = invoice_type();
    grown.proto = grown
        .proto
        .replace(
            "  Status status = 7;",
            "  Status status = 7;\n  string note = 8;",
        )
        .replace(
            "  STATUS_PAID = 2;",
            "  STATUS_PAID = 2;\n  STATUS_VOID = 3;",
        );
    grown.rules.push(pb::Rule {
        expression: "size(self.note) < 100".into(),
        message: "note is short".into(),
        field: "note".into(),
    });
    check_update(&old, &load(&grown)).expect("compatible");

    let cases: Vec<(Change, &str)> = vec![
        (
            Box::new(|t| t.proto = t.proto.replace("  string customer = 3;\n", "")),
            "field resd.payments.v1.Invoice.customer (number 3) is removed",
        ),
        (
            Box::new(|t| {
                t.proto = t
                    .proto
                    .replace("string customer = 3;", "string customer = 9;")
            }),
            "customer changes its number from 3 to 9",
        ),
        (
            Box::new(|t| {
                t.proto = t
                    .proto
                    .replace("string customer = 3;", "int64 customer = 3;")
            }),
            "customer changes type from string to int64",
        ),
        (
            Box::new(|t| {
                t.proto = t
                    .proto
                    .replace("string customer = 3;", "repeated string customer = 3;")
            }),
            "customer changes type from string to repeated string",
        ),
        (
            Box::new(|t| {
                t.proto = t
                    .proto
                    .replace("string customer = 3;", "string client = 3;")
            }),
            "renamed to client",
        ),
        (
            Box::new(|t| t.proto = t.proto.replace("  string city = 1;", "  int32 city = 1;")),
            "Address.city changes type",
        ),
        (
            Box::new(|t| t.proto = t.proto.replace("  STATUS_PAID = 2;\n", "")),
            "enum value STATUS_PAID (2)",
        ),
        (
            Box::new(|t| t.scope = pb::Scope::Cluster as i32),
            "data.scope cannot change",
        ),
    ];
    for (change, needle) in cases {
        let mut t = invoice_type();
        change(&mut t);
        let error = check_update(&old, &load(&t)).expect_err(needle);
        assert!(error.contains(needle), "{needle:?} in {error}");
        assert!(error.contains("a new version of the Type"), "{error}");
    }
}

/// A rule whose worst case is over the budget is refused when its Type is written, naming the
/// rule and the budget: nesting comprehensions over the data's lists is quadratic or worse.
#[test]
fn a_rule_whose_worst_case_is_over_budget_is_refused_at_registration() {
    for expression in [
        "self.lines.all(a, self.lines.all(b, self.lines.all(c, a.cents + b.cents + c.cents >= 0)))",
        "size(self.lines.map(l, self.customer + self.customer)) >= 0",
        // 16 bytes of pattern, 400 threads per byte of input.
        "self.customer.matches('[ab]*a[ab]{400}c')",
    ] {
        let mut t = invoice_type();
        t.rules = vec![pb::Rule {
            expression: expression.into(),
            message: "costly".into(),
            field: "lines".into(),
        }];
        let error = compile(&t).expect_err(expression);
        assert!(error.contains("data.rules[0].expression"), "{error}");
        assert!(error.contains("over the budget"), "{error}");
    }
}

/// Rules and schemas written to nest thousands of levels are refused with a message, and never
/// overflow the stack of the handler (a tokio worker's 2 MiB) or of a node loading them; a rule
/// as deep as allowed evaluates there.
#[test]
fn hostile_nesting_is_refused_without_overflowing_the_stack() {
    let worker = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(|| {
            for expression in [
                format!("size({}1{}) > 0", "[".repeat(2000), "]".repeat(2000)),
                format!("{}1 >= 0", "1 + ".repeat(1000)),
                format!("{}0{} >= 0", "(1 + ".repeat(580), ")".repeat(580)),
                format!("{}true", "!".repeat(3000)),
                format!("self{} == 0", ".amount_cents".repeat(300)),
                format!("{}1{}", "{1: ".repeat(700), "}".repeat(700)),
            ] {
                let mut t = invoice_type();
                t.rules[0].expression = expression.clone();
                let error = compile(&t).expect_err("refused");
                assert!(
                    error.contains("nests") || error.contains("does not compile"),
                    "{}: {error}",
                    &expression[..40]
                );
            }
            let mut source = String::from(
                "syntax = \"proto3\";\npackage resd.payments.v1;\nmessage Invoice { int64 amount_cents = 1; }\n",
            );
            source.push_str(&"message A {".repeat(20_000));
            source.push_str(&"}".repeat(20_000));
            let mut t = invoice_type();
            t.proto = source;
            let error = compile(&t).expect_err("too deep");
            assert!(error.contains("nests more than 32"), "{error}");
            // A custom option whose value nests 2,000 levels (6 KB): the compiler never sees it.
            let error = compile(&deep_option_type(2000)).expect_err("too deep");
            assert!(error.contains("nests more than 32"), "{error}");
            // Hidden from a scanner that does not read `#` comments or strings ended by a
            // line break as protox does.
            for hide in ["# /*\n", "# \"\\\n"] {
                let mut t = deep_option_type(2000);
                t.proto = t.proto.replace("message Invoice", &format!("{hide}message Invoice"));
                t.proto.push_str("# */\n");
                let error = compile(&t).expect_err("too deep");
                assert!(error.contains("nests more than 32"), "{hide:?}: {error}");
            }

            // A flat chain of messages, each holding the next: refused for its size, and an
            // update of one as long as allowed is compared without recursion.
            let chain = |count: usize| {
                let mut source = String::from(
                    "syntax = \"proto3\";\npackage resd.payments.v1;\nmessage Invoice { int64 amount_cents = 1; M0 next = 2; }\n",
                );
                for i in 0..count {
                    source.push_str(&format!("message M{i} {{ M{} next = 1; }}\n", i + 1));
                }
                source.push_str(&format!("message M{count} {{ int64 end = 1; }}\n"));
                let mut t = invoice_type();
                t.proto = source;
                t.rules.truncate(1);
                t.defaults.clear();
                t
            };
            let error = compile(&chain(20_000)).expect_err("too many messages");
            assert!(error.contains("at most 256"), "{error}");
            let long = load(&chain(250));
            check_update(&long, &long).expect("the same schema is compatible");

            // As deep as allowed: compiles, and evaluates on this stack.
            let mut t = invoice_type();
            t.rules[0].expression = format!("{} >= 0", vec!["self.amount_cents"; 40].join(" + "));
            let compiled = load(&t);
            let bytes = data(&compiled, serde_json::json!({"amountCents": 1, "customer": "x"}));
            rules(&compiled, &bytes, None).expect("evaluates");
        })
        .expect("thread");
    worker.join().expect("no stack overflow");
}

/// Past `--max-types`, a new Type is refused (an existing one may still change); a built-in or
/// another Type's group.version.Kind is never claimed.
#[test]
fn types_are_bounded_and_claims_are_exclusive() {
    let registry = crate::registry::Registry::builtin().expect("registry");
    let types = registry.dynamic();
    types.set_max_types(2);
    let invoice = compile(&invoice_type()).expect("compiles");
    types.install_stored(&stored("invoice", "10", "01A", &invoice));
    let mut other = invoice_type();
    other.kind = "Receipt".into();
    other.proto = other.proto.replace("message Invoice", "message Receipt");
    let receipt = compile(&other).expect("compiles");
    types.install_stored(&stored("receipt", "11", "01B", &receipt));
    assert_eq!(
        registry.types().filter(|r| r.registered.is_some()).count(),
        2
    );

    let invoice_gvk = resource::new_type("payments", "v1", "Invoice");
    types.check_claim("invoice", &invoice_gvk).expect("its own");
    let taken = types.check_claim("copy", &invoice_gvk).expect_err("taken");
    assert!(
        taken.contains("already registered by Type invoice"),
        "{taken}"
    );
    let full = types
        .check_claim("third", &resource::new_type("payments", "v1", "Refund"))
        .expect_err("full");
    assert!(full.contains("--max-types allows (2)"), "{full}");
    let builtin = types
        .check_claim("mine", &resource::new_type("demo", "v2", "Artist"))
        .expect_err("built in");
    assert!(builtin.contains("built-in type"), "{builtin}");

    // Resolving a registered type is a map lookup; uninstalling removes it.
    assert!(registry.resolve(&invoice_gvk).is_some());
    types.remove("invoice");
    assert!(registry.resolve(&invoice_gvk).is_none());
}

/// A rule that runs out of its budget on a large resource fails the write with a cost error;
/// one that divides by zero fails it as a violation, it does not panic the handler.
#[test]
fn rules_that_run_out_of_budget_or_fail_fail_the_write() {
    let mut t = invoice_type();
    t.rules = vec![pb::Rule {
        expression: "self.lines.all(l, l.item.matches('^[a-z]*$'))".into(),
        message: "items are words".into(),
        field: String::new(),
    }];
    let compiled = load(&t);
    let lines: Vec<serde_json::Value> = (0..2000)
        .map(|_| serde_json::json!({"item": "x".repeat(1000)}))
        .collect();
    let bytes = data(&compiled, serde_json::json!({"lines": lines}));
    // Within the rule's budget, not within a request's budget that is nearly spent.
    compiled
        .check_rules(&bytes, None, &mut Meter::new(cel::REQUEST_BUDGET))
        .expect("within budget");
    let error = compiled
        .check_rules(&bytes, None, &mut Meter::new(1000))
        .expect_err("over budget");
    assert!(matches!(error, RuleFailure::Cost(_)), "{error}");
    assert!(error.to_string().contains("ran out of"), "{error}");

    let mut t = invoice_type();
    t.rules = vec![pb::Rule {
        expression: "self.amount_cents / size(self.lines) >= 0".into(),
        message: "average".into(),
        field: String::new(),
    }];
    let compiled = load(&t);
    let error = rules(
        &compiled,
        &data(&compiled, serde_json::json!({"amountCents": 10})),
        None,
    )
    .expect_err("divided by zero");
    assert!(error.contains("could not be evaluated"), "{error}");
}

/// Two Types of one group and version share a package: a second one declaring a message the
/// first declares is refused, and defaults on oneof members are refused.
#[test]
fn clashing_declarations_and_oneof_defaults_are_refused() {
    let registry = crate::registry::Registry::builtin().expect("registry");
    let types = registry.dynamic();
    let invoice = compile(&invoice_type()).expect("compiles");
    types.install_stored(&stored("invoice", "1", "01A", &invoice));
    let mut receipt = invoice_type();
    receipt.kind = "Receipt".into();
    receipt.proto = receipt.proto.replace("message Invoice", "message Receipt");
    receipt.rules.clear();
    let compiled = load(&receipt);
    let error = types
        .check_symbols("receipt", &compiled)
        .expect_err("Line twice");
    assert!(error.contains("which Type invoice declares too"), "{error}");
    // The invoice itself, rewritten, fits beside the rest.
    types
        .check_symbols("invoice", &load(&invoice_type()))
        .expect("its own names");

    let mut t = invoice_type();
    t.proto = t.proto.replace(
        "  Status status = 7;",
        "  Status status = 7;\n  oneof payment { string iban = 8; string card = 9; }",
    );
    t.defaults = vec![pb::Default {
        field: "iban".into(),
        value: "\"DE00\"".into(),
    }];
    let error = compile(&t).expect_err("oneof default");
    assert!(error.contains("member of oneof payment"), "{error}");
    // A reserved package is refused.
    let mut t = invoice_type();
    t.group = "resource".into();
    assert!(compile(&t).expect_err("reserved").contains("reserved"));
}

/// Two Types claiming one group.version.Kind (written at once on two nodes): every node makes
/// the earlier-created one the owner, whatever order it learns them in; the other owns
/// nothing, and its removal leaves the owner in place. A read older than a removal does not
/// bring a Type back, nor an older version replace a newer one.
#[test]
fn concurrent_claims_resolve_the_same_way_everywhere_and_installs_only_move_forward() {
    let invoice = compile(&invoice_type()).expect("compiles");
    let gvk = resource::new_type("payments", "v1", "Invoice");
    let owner_of = |registry: &crate::registry::Registry| {
        registry
            .resolve(&gvk)
            .and_then(|r| r.registered.as_ref().map(|i| i.name.clone()))
    };
    for order in [["first", "second"], ["second", "first"]] {
        let registry = crate::registry::Registry::builtin().expect("registry");
        for name in order {
            let uid = if name == "first" { "01A" } else { "01B" };
            registry
                .dynamic()
                .install_stored(&stored(name, "5", uid, &invoice));
        }
        assert_eq!(owner_of(&registry).as_deref(), Some("first"), "{order:?}");
        registry.dynamic().remove("second");
        assert_eq!(owner_of(&registry).as_deref(), Some("first"));
        registry.dynamic().remove("first");
        assert_eq!(owner_of(&registry), None);
    }

    // A status written on the Type moves the version its writes are fenced on, and compiles
    // nothing again (the same compiled schema is kept).
    let registry = crate::registry::Registry::builtin().expect("registry");
    let types = registry.dynamic();
    types.install_stored(&stored("invoice", "10", "01A", &invoice));
    let before = types.installed("invoice").expect("installed");
    types.install_stored(&stored("invoice", "12", "01A", &invoice));
    let after = types.installed("invoice").expect("installed");
    assert_eq!(after.version, "12");
    assert!(Arc::ptr_eq(&before.compiled, &after.compiled));
    assert_eq!(types.revision(), resource::Version::new(12));
}

/// The invoice's data message, as its Type compiles it.
pub(crate) fn invoice_message() -> MessageDescriptor {
    let mut bare = invoice_type();
    bare.rules.clear();
    bare.defaults.clear();
    let compiled = compile(&bare).expect("the invoice compiles");
    CompiledType::load(&compiled).expect("loads").message
}

/// The rules on `data` with a request's whole budget, failures as text.
fn rules(compiled: &CompiledType, data: &[u8], old: Option<&[u8]>) -> Result<(), String> {
    compiled
        .check_rules(data, old, &mut Meter::new(cel::REQUEST_BUDGET))
        .map_err(|failure| failure.to_string())
}

/// A Type whose message carries a custom option with a value nested `levels` deep.
pub(crate) fn deep_option_type(levels: usize) -> pb::Type {
    let mut t = invoice_type();
    t.rules.clear();
    t.defaults.clear();
    t.proto = format!(
        "syntax = \"proto3\";\npackage resd.payments.v1;\nimport \"google/protobuf/descriptor.proto\";\nmessage Deep {{ Deep d = 1; }}\nextend google.protobuf.MessageOptions {{ Deep deep = 50000; }}\nmessage Invoice {{ option (deep) = {}{{}}{}; int64 amount_cents = 1; }}\n",
        "{ d: ".repeat(levels),
        "}".repeat(levels)
    );
    t
}

#[test]
fn nesting_within_the_bound_compiles_and_brackets_in_comments_and_strings_do_not_count() {
    compile(&deep_option_type(20)).expect("20 levels are fine");
    let mut t = invoice_type();
    t.proto = format!(
        "{}\n// {}\n/* {} */\nmessage Note {{ string s = 1 [json_name = \"{}\"]; }}\n",
        INVOICE,
        "{".repeat(100),
        "[".repeat(100),
        "(".repeat(100)
    );
    compile(&t).expect("brackets in comments and strings do not nest");
}

#[test]
fn a_schema_over_the_field_limit_is_refused() {
    let mut t = invoice_type();
    t.rules.clear();
    t.defaults.clear();
    let fields: String = (1..=MAX_FIELDS + 1)
        .map(|i| format!("  int32 f{i} = {i};\n"))
        .collect();
    t.proto = format!(
        "syntax = \"proto3\";\npackage resd.payments.v1;\nmessage Invoice {{\n{fields}}}\n"
    );
    let error = compile(&t).expect_err("too many fields");
    assert!(error.contains("10001 fields"), "{error}");
    assert!(error.contains("at most 10000"), "{error}");
}

/// Ratcheting: a violation counts unless the stored data broke the same rule and the rule's
/// field is unchanged.
#[test]
fn ratcheting_lets_unchanged_broken_fields_pass() {
    let mut t = invoice_type();
    t.rules = vec![
        pb::Rule {
            expression: "self.amount_cents <= 1000".into(),
            message: "small".into(),
            field: "amount_cents".into(),
        },
        pb::Rule {
            expression: "self.customer != ''".into(),
            message: "has a customer".into(),
            field: String::new(),
        },
    ];
    let compiled = load(&t);
    let old = data(
        &compiled,
        serde_json::json!({"amountCents": 5000, "customer": "a"}),
    );
    let new_other_field = data(
        &compiled,
        serde_json::json!({"amountCents": 5000, "customer": "b"}),
    );
    let new_amount = data(
        &compiled,
        serde_json::json!({"amountCents": 4000, "customer": "b"}),
    );
    let mut meter = Meter::new(cel::REQUEST_BUDGET);
    let violations =
        |bytes: &[u8], meter: &mut Meter| match compiled.check_rules(bytes, None, meter) {
            Err(RuleFailure::Violations(v)) => v,
            other => panic!("{other:?}"),
        };
    let found = violations(&new_other_field, &mut meter);
    assert!(
        compiled
            .ratchet(found, &new_other_field, &old, &mut meter)
            .expect("ratchets")
            .is_empty()
    );
    let found = violations(&new_amount, &mut meter);
    let left = compiled
        .ratchet(found, &new_amount, &old, &mut meter)
        .expect("ratchets");
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].field, "resource.data.amount_cents");
    // A rule the stored data satisfied is never ratcheted.
    let good_old = data(
        &compiled,
        serde_json::json!({"amountCents": 5, "customer": "a"}),
    );
    let found = violations(&new_other_field, &mut meter);
    assert_eq!(
        compiled
            .ratchet(found, &new_other_field, &good_old, &mut meter)
            .expect("ratchets")
            .len(),
        1
    );
}

/// Ratcheting forgives a broken rule by what the rule reads, not by the field it says it is
/// reported on: a rule reading `amount_cents` reported on `customer` still refuses a changed
/// amount when the customer is unchanged, and a rule reading into a well-known type (`due`, a
/// Timestamp: a string to rules) sees it change. Both were forgiven before.
#[test]
fn ratcheting_compares_what_a_rule_reads() {
    let mut t = invoice_type();
    t.rules = vec![
        pb::Rule {
            expression: "self.amount_cents <= 1000".into(),
            message: "small".into(),
            field: "customer".into(),
        },
        pb::Rule {
            expression: "self.due < '2000-01-01' || self.billing.city == 'x'".into(),
            message: "due before 2000".into(),
            field: "billing.city".into(),
        },
    ];
    let compiled = load(&t);
    let old = data(
        &compiled,
        serde_json::json!({"amountCents": 5000, "customer": "a", "due": "2030-01-01T00:00:00Z"}),
    );
    let new = data(
        &compiled,
        serde_json::json!({"amountCents": 9000, "customer": "a", "due": "2031-01-01T00:00:00Z"}),
    );
    let mut meter = Meter::new(cel::REQUEST_BUDGET);
    let found = match compiled.check_rules(&new, None, &mut meter) {
        Err(RuleFailure::Violations(v)) => v,
        other => panic!("{other:?}"),
    };
    assert_eq!(found.len(), 2);
    let left = compiled
        .ratchet(found, &new, &old, &mut meter)
        .expect("ratchets");
    assert_eq!(left.len(), 2, "{left:?}");
    // Unchanged reads: both forgiven.
    let same_reads = data(
        &compiled,
        serde_json::json!({"amountCents": 5000, "customer": "b", "due": "2030-01-01T00:00:00Z", "currency": "USD"}),
    );
    let found = match compiled.check_rules(&same_reads, None, &mut meter) {
        Err(RuleFailure::Violations(v)) => v,
        other => panic!("{other:?}"),
    };
    assert!(
        compiled
            .ratchet(found, &same_reads, &old, &mut meter)
            .expect("ratchets")
            .is_empty()
    );
}

/// Data of a recursive message nests only as deep as a schema may.
#[test]
fn data_nesting_is_measured_without_recursion_and_bounded() {
    let mut t = invoice_type();
    t.rules.clear();
    t.defaults.clear();
    t.kind = "Tree".into();
    t.proto = "syntax = \"proto3\";\npackage resd.payments.v1;\nmessage Tree { repeated Tree children = 1; map<string, Tree> named = 2; }\n".into();
    let compiled = load(&t);
    let nested = |levels: usize| {
        let mut json = serde_json::json!({});
        for i in 0..levels - 1 {
            json = if i % 2 == 0 {
                serde_json::json!({"children": [json]})
            } else {
                serde_json::json!({"named": {"x": json}})
            };
        }
        DynamicMessage::deserialize(compiled.message.clone(), json).expect("tree")
    };
    assert_eq!(message_depth(&nested(1)), 1);
    assert_eq!(message_depth(&nested(32)), 32);
    assert_eq!(message_depth(&nested(60)), 60);
}

/// Small data under cheap rules is checked where the request is handled; large data, or rules
/// that could be costly even on small data, go to the pool.
#[test]
fn only_cheap_checks_run_inline() {
    let compiled = load(&invoice_type());
    assert!(compiled.checks_inline(1000, true));
    assert!(!compiled.checks_inline(1 << 20, false));
    let mut t = invoice_type();
    t.rules = vec![pb::Rule {
        expression: "self.lines.all(a, self.lines.exists(b, a.cents == b.cents))".into(),
        message: "quadratic".into(),
        field: String::new(),
    }];
    // Refused outright: its worst case over 4 MiB is far over budget.
    assert!(compile(&t).is_err());
}
