//! Types registered at runtime (DESIGN §15): a `registry.v1.Type` compiled into what the
//! resource service needs to treat its resources like a built-in type's — the data message (a
//! [`MessageDescriptor`] from the stored descriptor set), its CEL rules and its defaults.
//!
//! [`compile`] runs in the request handler of a Type write, before proposing: protox turns the
//! `.proto` source into the descriptor set stored beside it, and everything else is checked
//! against that. [`CompiledType::load`] rebuilds the same thing from a stored Type on every node
//! (from the stored descriptor set, never recompiling): nodes that have the same version of a
//! Type have the same type.
//!
//! Rules are CEL over `self` (the decoded data, proto field names) and, on an update, `old`,
//! run by [`super::cel`]: estimated when the Type is written (a rule whose worst case exceeds
//! [`cel::RULE_BUDGET`] is refused) and metered while they run.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use cel_parser::{Expression, Member};
use prost::Message as _;
use prost_reflect::{
    DescriptorPool, DynamicMessage, FieldDescriptor, Kind, MessageDescriptor, SerializeOptions,
};
use proto::codec::field_type_name;
use proto::registry::v1 as pb;

use super::Scope;
use super::cel::{self, EvalError, Meter};
use crate::resource;

/// Groups of the built-in types and packages: no Type may register in them (its package
/// `resd.<group>.<version>` would share theirs).
pub(crate) const RESERVED_GROUPS: [&str; 11] = [
    "internal",
    "events",
    "policy",
    "tenancy",
    "acl",
    "registry",
    "coordination",
    "demo",
    "resource",
    "cluster",
    "raft",
];
/// Largest `.proto` source.
pub(crate) const MAX_SCHEMA_BYTES: usize = 1 << 20;
/// Most rules of one type.
pub(crate) const MAX_RULES: usize = 64;
/// Most defaults of one type.
pub(crate) const MAX_DEFAULTS: usize = 64;
/// Most messages and enums one schema may declare (nested ones included).
pub(crate) const MAX_DECLARATIONS: usize = 256;
/// Most fields one schema may declare, over all its messages.
pub(crate) const MAX_FIELDS: usize = 10_000;
/// Deepest a schema's source may nest brackets of any kind (messages in messages, option
/// values, lists): checked before the compiler, which recurses once per level, runs.
pub(crate) const MAX_SOURCE_NESTING: usize = 32;
/// Longest rule expression, message or field path.
const MAX_RULE_TEXT: usize = 4096;
/// Deepest expression a rule may nest (evaluating it recurses once per level).
pub(crate) const MAX_RULE_DEPTH: usize = 48;

/// A compiled rule.
#[derive(Debug)]
struct Rule {
    index: usize,
    program: cel::Program,
    message: String,
    field: String,
    /// Whether it reads `old` (then it runs on updates only, as a transition rule).
    uses_old: bool,
    /// The fields of the data it reads (dot paths; "" for the whole data): ratcheting forgives
    /// a violation only when all of them are unchanged, whatever `field` it is reported on.
    reads: BTreeSet<String>,
}

/// One rule that does not hold on a resource (Kubernetes' `field.Error`): the field it is
/// reported on (`resource.data` or `resource.data.<field>`), what it says, and which rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Violation {
    /// The rule's index in the Type; `None` for data that cannot be read at all.
    pub rule: Option<usize>,
    pub field: String,
    pub message: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Why a resource's data did not pass its type's rules.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum RuleFailure {
    /// Rules that do not hold (or cannot be evaluated on this data), each naming its field.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Violations(Vec<Violation>),
    /// A rule, or the request's rules together, ran out of budget.
    #[error("{0}")]
    Cost(String),
}

/// A registered type, ready to use.
#[derive(Debug)]
pub(crate) struct CompiledType {
    pub resource_type: proto::resource::v1::Type,
    pub scope: Scope,
    pub message: MessageDescriptor,
    /// The stored descriptor set (the type's file and its imports).
    pub descriptor_set: Vec<u8>,
    rules: Vec<Rule>,
    defaults: Vec<(FieldDescriptor, prost_reflect::Value)>,
    /// Every name the Type's own file puts in its package (messages, enums and enum values,
    /// nested ones included) and every extension it declares (`extendee#number`): what must
    /// not clash with another Type's.
    pub symbols: BTreeSet<String>,
    /// Whether it declares extensions (their numbers may clash across packages).
    pub extends: bool,
    /// What its defaults may add to a resource's data, at most (their JSON text, which is no
    /// shorter than their encoding but for a few bytes of tag).
    defaults_bytes: usize,
}

/// The file name the server compiles a Type's source as.
pub(crate) fn file_name(t: &pb::Type) -> String {
    format!("resd/{}/{}/{}.proto", t.group, t.group_version, t.kind)
}

/// The package a Type's source must declare.
pub(crate) fn package(t: &pb::Type) -> String {
    format!("resd.{}.{}", t.group, t.group_version)
}

/// Checks a Type as written and compiles its source: the Type to store (its `descriptor_set`
/// the compiler's), or every problem found, each naming its field.
pub(crate) fn compile(t: &pb::Type) -> Result<pb::Type, String> {
    let history = super::versions::history_problems(t);
    if !history.is_empty() {
        return Err(history.join("; "));
    }
    if super::versions::is_multi_version(t) {
        return super::versions::compile(t);
    }
    let mut problems = super::versions::column_problems("data.columns", &t.columns);
    let resource_type = resource::new_type(&t.group, &t.group_version, &t.kind);
    for violation in resource::type_violations(&resource_type) {
        problems.push(format!("data.{violation}"));
    }
    if RESERVED_GROUPS.contains(&t.group.as_str()) {
        problems.push(format!(
            "data.group {:?} is reserved for built-in types ({}); choose a group of your own",
            t.group,
            RESERVED_GROUPS.join(", ")
        ));
    }
    if scope_of(t.scope).is_none() {
        problems.push(
            "data.scope is required: SCOPE_CLUSTER, SCOPE_PARTITION or SCOPE_NAMESPACE".into(),
        );
    }
    if t.proto.trim().is_empty() {
        problems.push("data.proto is required: the text of one .proto file".into());
    } else if t.proto.len() > MAX_SCHEMA_BYTES {
        problems.push(format!(
            "data.proto is {} bytes; a schema may have at most {MAX_SCHEMA_BYTES}",
            t.proto.len()
        ));
    }
    if t.rules.len() > MAX_RULES {
        problems.push(format!(
            "data.rules has {} rules; a type may have at most {MAX_RULES}",
            t.rules.len()
        ));
    }
    if t.defaults.len() > MAX_DEFAULTS {
        problems.push(format!(
            "data.defaults has {} entries; a type may have at most {MAX_DEFAULTS}",
            t.defaults.len()
        ));
    }
    if !problems.is_empty() {
        return Err(problems.join("; "));
    }
    check_source_nesting(&t.proto)?;
    let descriptor_set = compile_source(t)?;
    let compiled = pb::Type {
        descriptor_set,
        ..t.clone()
    };
    CompiledType::load(&compiled)?;
    Ok(compiled)
}

/// Compiles the `.proto` source of `t` (with the well-known types importable) into an encoded
/// descriptor set with source info (comments, for `resctl explain`).
fn compile_source(t: &pb::Type) -> Result<Vec<u8>, String> {
    let name = file_name(t);
    let mut resolver = protox::file::ChainFileResolver::new();
    resolver.add(SourceResolver {
        name: name.clone(),
        source: t.proto.clone(),
    });
    resolver.add(protox::file::GoogleFileResolver::new());
    let mut compiler = protox::Compiler::with_file_resolver(resolver);
    compiler.include_imports(true).include_source_info(true);
    compiler.open_file(&name).map_err(|error| {
        // The Debug form carries the file, line and column: `resd/…/Invoice.proto:3:9: …`.
        format!("data.proto does not compile: {error:?}")
    })?;
    let package = package(t);
    let set = compiler.file_descriptor_set();
    let file = set
        .file
        .iter()
        .find(|file| file.name() == name)
        .ok_or_else(|| "data.proto does not compile: the file is missing".to_owned())?;
    if file.package() != package {
        return Err(format!(
            "data.proto declares package {:?}; a Type {}.{}.{} must declare `package {package};`",
            file.package(),
            t.group,
            t.group_version,
            t.kind
        ));
    }
    let (declarations, fields) = count_declarations(file);
    if declarations > MAX_DECLARATIONS {
        return Err(format!(
            "data.proto declares {declarations} messages and enums; a schema may declare at most {MAX_DECLARATIONS}"
        ));
    }
    if fields > MAX_FIELDS {
        return Err(format!(
            "data.proto declares {fields} fields; a schema may declare at most {MAX_FIELDS} (split the type, or keep large maps of data in a map field)"
        ));
    }
    if !file.message_type.iter().any(|m| m.name() == t.kind) {
        let declared: Vec<&str> = file.message_type.iter().map(|m| m.name()).collect();
        return Err(format!(
            "data.proto has no message {} (the kind); it declares {}",
            t.kind,
            if declared.is_empty() {
                "none".to_owned()
            } else {
                declared.join(", ")
            }
        ));
    }
    Ok(compiler.encode_file_descriptor_set())
}

/// Messages and enums a file declares, nested ones included, and their fields and extensions
/// (counted without recursion).
fn count_declarations(file: &prost_types::FileDescriptorProto) -> (usize, usize) {
    let mut count = file.enum_type.len();
    let mut fields = file.extension.len();
    let mut pending: Vec<&prost_types::DescriptorProto> = file.message_type.iter().collect();
    while let Some(message) = pending.pop() {
        count += 1 + message.enum_type.len();
        fields += message.field.len() + message.extension.len();
        pending.extend(message.nested_type.iter());
    }
    (count, fields)
}

/// How deeply a message nests messages (itself 1), measured with an explicit stack: the data
/// of a registered type may nest at most [`MAX_SOURCE_NESTING`] levels, like its schema, before
/// anything walks it recursively (rules, JSON).
pub(crate) fn message_depth(message: &DynamicMessage) -> usize {
    depth_from(message, 0)
}

/// [`message_depth`] of a message found `base` levels down. Recursive once per level of Any,
/// and it stops past [`MAX_SOURCE_NESTING`] (each level adds one): at most 33 calls deep.
fn depth_from(message: &DynamicMessage, base: usize) -> usize {
    use prost_reflect::{ReflectMessage, Value};
    let mut deepest = 0;
    let mut pending: Vec<(&Value, usize)> = Vec::new();
    let mut messages: Vec<(&DynamicMessage, usize)> = vec![(message, base + 1)];
    // Payloads of Any, decoded here; measured by a call of their own (bounded: each level
    // of Any is one call, and a chain deeper than the limit stops it).
    let mut owned: Vec<(DynamicMessage, usize)> = Vec::new();
    loop {
        if let Some((message, depth)) = messages.pop() {
            deepest = deepest.max(depth);
            pending.extend(message.fields().map(|(_, value)| (value, depth)));
            continue;
        }
        if pending.is_empty()
            && let Some((payload, depth)) = owned.pop()
        {
            if depth > MAX_SOURCE_NESTING {
                return depth;
            }
            let inner = depth_from(&payload, depth - 1);
            if inner == usize::MAX {
                return usize::MAX;
            }
            deepest = deepest.max(inner);
            if deepest > MAX_SOURCE_NESTING {
                return deepest;
            }
            continue;
        }
        let Some((value, depth)) = pending.pop() else {
            break;
        };
        match value {
            // An Any's payload is decoded (and turned into JSON) by whoever reads it: it counts,
            // level by level; one whose type this schema does not know counts as too deep.
            Value::Message(inner) if inner.descriptor().full_name() == "google.protobuf.Any" => {
                let url = inner
                    .get_field_by_name("type_url")
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default();
                let payload = inner
                    .get_field_by_name("value")
                    .and_then(|v| v.as_bytes().cloned())
                    .unwrap_or_default();
                let name = url.rsplit('/').next().unwrap_or_default();
                match inner.descriptor().parent_pool().get_message_by_name(name) {
                    _ if url.is_empty() && payload.is_empty() => {
                        deepest = deepest.max(depth + 1);
                    }
                    Some(descriptor) => match DynamicMessage::decode(descriptor, payload) {
                        Ok(decoded) => owned.push((decoded, depth + 1)),
                        Err(_) => return usize::MAX,
                    },
                    None => return usize::MAX,
                }
            }
            Value::Message(inner) => messages.push((inner, depth + 1)),
            Value::List(items) => pending.extend(items.iter().map(|item| (item, depth))),
            Value::Map(entries) => pending.extend(entries.values().map(|item| (item, depth))),
            _ => {}
        }
    }
    deepest
}

/// Refuses a source that nests brackets (`{`, `[`, `(`, `<`) deeper than
/// [`MAX_SOURCE_NESTING`], outside comments and string literals: the compiler parses option
/// values and messages recursively, and a schema of a few kilobytes could overflow its stack.
fn check_source_nesting(source: &str) -> Result<(), String> {
    let bytes = source.as_bytes();
    let (mut depth, mut line, mut i) = (0usize, 1usize, 0usize);
    while i < bytes.len() {
        match bytes[i] {
            b'\n' => line += 1,
            // protox reads `#` as a line comment too.
            b'#' => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
                continue;
            }
            b'/' if bytes.get(i + 1) == Some(&b'/') => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
                continue;
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i < bytes.len() && !(bytes[i] == b'*' && bytes.get(i + 1) == Some(&b'/')) {
                    line += usize::from(bytes[i] == b'\n');
                    i += 1;
                }
                i += 2;
                continue;
            }
            quote @ (b'"' | b'\'') => {
                i += 1;
                // A string ends at its quote or at the end of its line, escaped or not.
                while i < bytes.len() && bytes[i] != quote && bytes[i] != b'\n' {
                    i += if bytes[i] == b'\\' && bytes.get(i + 1) != Some(&b'\n') {
                        2
                    } else {
                        1
                    };
                }
                if bytes.get(i) == Some(&b'\n') {
                    continue;
                }
            }
            b'{' | b'[' | b'(' | b'<' => {
                depth += 1;
                if depth > MAX_SOURCE_NESTING {
                    return Err(format!(
                        "data.proto nests more than {MAX_SOURCE_NESTING} levels of brackets (at line {line}); messages and option values may nest at most {MAX_SOURCE_NESTING} deep"
                    ));
                }
            }
            b'}' | b']' | b')' | b'>' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    Ok(())
}

/// The names a file declares in its package, and its extensions (see
/// [`CompiledType::symbols`]), found without recursion.
trait Symbols {
    fn pipe_symbols(&self) -> BTreeSet<String>;
}

impl Symbols for prost_reflect::FileDescriptor {
    fn pipe_symbols(&self) -> BTreeSet<String> {
        let mut symbols = BTreeSet::new();
        let package = self.package_name().to_owned();
        let mut enums: Vec<prost_reflect::EnumDescriptor> = self.enums().collect();
        let mut pending: Vec<MessageDescriptor> = self.messages().collect();
        while let Some(message) = pending.pop() {
            symbols.insert(message.full_name().to_owned());
            enums.extend(message.child_enums());
            pending.extend(message.child_messages());
        }
        for e in enums {
            symbols.insert(e.full_name().to_owned());
            // Enum values are scoped like their enum's siblings.
            let scope = e
                .full_name()
                .rsplit_once('.')
                .map_or(package.clone(), |(scope, _)| scope.to_owned());
            for value in e.values() {
                symbols.insert(format!("{scope}.{}", value.name()));
            }
        }
        for extension in self.extensions() {
            symbols.insert(extension.full_name().to_owned());
            symbols.insert(format!(
                "{}#{}",
                extension.containing_message().full_name(),
                extension.number()
            ));
        }
        symbols
    }
}

/// Serves the one source file of a Type to protox.
struct SourceResolver {
    name: String,
    source: String,
}

impl protox::file::FileResolver for SourceResolver {
    fn open_file(&self, name: &str) -> Result<protox::file::File, protox::Error> {
        if name == self.name {
            protox::file::File::from_source(name, &self.source)
        } else {
            Err(protox::Error::file_not_found(name))
        }
    }
}

/// The scope a Type names.
pub(crate) fn scope_of(scope: i32) -> Option<Scope> {
    match pb::Scope::try_from(scope) {
        Ok(pb::Scope::Cluster) => Some(Scope::Cluster),
        Ok(pb::Scope::Partition) => Some(Scope::Partition),
        Ok(pb::Scope::Namespace) => Some(Scope::Namespace),
        _ => None,
    }
}

impl CompiledType {
    /// Builds a type from a stored (compiled) Type: its message, rules and defaults.
    pub(crate) fn load(t: &pb::Type) -> Result<CompiledType, String> {
        // Without source info (the comments are for clients, in the stored set): a pool costs
        // about ten times what it holds, and locations are half of that.
        let mut set = prost_types::FileDescriptorSet::decode(t.descriptor_set.as_slice())
            .map_err(|error| format!("data.descriptor_set is not a descriptor set: {error}"))?;
        for file in &mut set.file {
            file.source_code_info = None;
        }
        let pool = DescriptorPool::from_file_descriptor_set(set)
            .map_err(|error| format!("data.descriptor_set is not a descriptor set: {error}"))?;
        let message_name = format!("{}.{}", package(t), t.kind);
        let message = pool
            .get_message_by_name(&message_name)
            .ok_or_else(|| format!("data.descriptor_set holds no message {message_name}"))?;
        let scope = scope_of(t.scope).ok_or_else(|| "data.scope is required".to_owned())?;
        let symbols = message.parent_file().pipe_symbols();
        let mut problems = Vec::new();
        let mut rules = Vec::new();
        for (index, rule) in t.rules.iter().enumerate() {
            match compile_rule(index, rule, &message) {
                Ok(rule) => rules.push(rule),
                Err(why) => problems.push(why),
            }
        }
        let mut defaults = Vec::new();
        for (index, default) in t.defaults.iter().enumerate() {
            match compile_default(&message, default) {
                Ok(value) => defaults.push(value),
                Err(why) => problems.push(format!("data.defaults[{index}]: {why}")),
            }
        }
        if !problems.is_empty() {
            return Err(problems.join("; "));
        }
        Ok(CompiledType {
            resource_type: resource::new_type(&t.group, &t.group_version, &t.kind),
            scope,
            message,
            descriptor_set: t.descriptor_set.clone(),
            rules,
            defaults,
            extends: symbols.iter().any(|symbol| symbol.contains('#')),
            defaults_bytes: t
                .defaults
                .iter()
                .map(|default| default.value.len() + default.field.len() + 8)
                .sum(),
            symbols,
        })
    }

    /// Sets the defaults on unset fields of `data` (the mutate step). `None` when nothing was
    /// set.
    pub(crate) fn apply_defaults(&self, data: &[u8]) -> Result<Option<Vec<u8>>, String> {
        if self.defaults.is_empty() {
            return Ok(None);
        }
        let mut message = DynamicMessage::decode(self.message.clone(), data)
            .map_err(|error| format!("resource.data invalid: {error}"))?;
        let mut changed = false;
        for (field, value) in &self.defaults {
            if !message.has_field(field) {
                message.set_field(field, value.clone());
                changed = true;
            }
        }
        Ok(changed.then(|| message.encode_to_vec()))
    }

    /// Checks the rules on `data`: those without `old` always, those with `old` when `old` (the
    /// stored data) is given. Each rule may spend [`cel::RULE_BUDGET`] units, and all of them
    /// together what is left of `meter` (the request's budget).
    pub(crate) fn check_rules(
        &self,
        data: &[u8],
        old: Option<&[u8]>,
        meter: &mut Meter,
    ) -> Result<(), RuleFailure> {
        self.check_rules_of(data, old, meter, |_| true)
    }

    /// [`Self::check_rules`] for the rules `which` selects (by index).
    pub(crate) fn check_rules_of(
        &self,
        data: &[u8],
        old: Option<&[u8]>,
        meter: &mut Meter,
        which: impl Fn(usize) -> bool,
    ) -> Result<(), RuleFailure> {
        let relevant: Vec<&Rule> = self
            .rules
            .iter()
            .filter(|rule| rule.uses_old == old.is_some() || !rule.uses_old)
            .filter(|rule| which(rule.index))
            .collect();
        if relevant.is_empty() {
            return Ok(());
        }
        let mut variables = vec![(Arc::new("self".to_owned()), self.cel_value(data)?)];
        if let Some(old) = old {
            variables.push((Arc::new("old".to_owned()), self.cel_value(old)?));
        }
        let mut problems = Vec::new();
        for rule in relevant {
            let at = rule_field(&rule.field);
            let violation = |message: String| Violation {
                rule: Some(rule.index),
                field: at.clone(),
                message,
            };
            let left = meter.left();
            let mut rule_meter = Meter::new(left.min(cel::RULE_BUDGET));
            let evaluated =
                cel::Evaluator::new(&rule.program, variables.clone(), &mut rule_meter).run();
            meter.spend(rule_meter.used());
            match evaluated {
                Ok(cel::Value::Bool(true)) => {}
                Ok(cel::Value::Bool(false)) => problems.push(violation(rule.message.clone())),
                Ok(other) => problems.push(violation(format!(
                    "rule {} ({}) gave {other}, not a bool",
                    rule.index, rule.message
                ))),
                Err(EvalError::OverBudget { limit }) => {
                    let whose = if limit < cel::RULE_BUDGET {
                        format!(
                            "the request's rules together ran out of their budget of {} units",
                            cel::REQUEST_BUDGET
                        )
                    } else {
                        format!("it ran out of its budget of {limit} units")
                    };
                    return Err(RuleFailure::Cost(format!(
                        "{at}: rule {} ({}) was stopped: {whose} on this resource; make the data smaller or the rule cheaper",
                        rule.index, rule.message
                    )));
                }
                Err(EvalError::Runtime(error)) => problems.push(violation(format!(
                    "rule {} ({}) could not be evaluated: {error}",
                    rule.index, rule.message
                ))),
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(RuleFailure::Violations(problems))
        }
    }

    /// The rules that read `old` (transition rules) on an update from `old` to `data`.
    pub(crate) fn check_transition_rules(
        &self,
        data: &[u8],
        old: &[u8],
        meter: &mut Meter,
    ) -> Result<(), RuleFailure> {
        self.check_rules_of(data, Some(old), meter, |index| {
            self.rules.get(index).is_some_and(|rule| rule.uses_old)
        })
    }

    /// Ratcheting (DESIGN §15, Kubernetes' KEP-4008): which of `violations` (found on `data`)
    /// still count on an update from `old`. One counts unless its rule broke on `old` too and
    /// the field it is reported on (the whole data for a rule without one) is unchanged.
    pub(crate) fn ratchet(
        &self,
        violations: Vec<Violation>,
        data: &[u8],
        old: &[u8],
        meter: &mut Meter,
    ) -> Result<Vec<Violation>, RuleFailure> {
        if violations.iter().all(|v| v.rule.is_none()) {
            return Ok(violations);
        }
        let failed: BTreeSet<usize> = violations.iter().filter_map(|v| v.rule).collect();
        let broke_before: BTreeSet<usize> = match self
            .check_rules_of(old, None, meter, |index| failed.contains(&index))
        {
            Ok(()) => BTreeSet::new(),
            Err(RuleFailure::Violations(before)) => before.iter().filter_map(|v| v.rule).collect(),
            Err(cost) => return Err(cost),
        };
        let (new_value, old_value) = (self.cel_value(data)?, self.cel_value(old)?);
        Ok(violations
            .into_iter()
            .filter(|violation| {
                let Some(index) = violation.rule else {
                    return true;
                };
                let unchanged = self.rules[index]
                    .reads
                    .iter()
                    .all(|path| value_at(&new_value, path) == value_at(&old_value, path));
                !(broke_before.contains(&index) && unchanged)
            })
            .collect())
    }

    /// The data as a CEL value (proto field names, every scalar field present, 64-bit integers
    /// as numbers).
    pub(super) fn cel_value(&self, data: &[u8]) -> Result<cel::Value, RuleFailure> {
        let invalid = |error: &dyn std::fmt::Display| {
            RuleFailure::Violations(vec![Violation {
                rule: None,
                field: "resource.data".into(),
                message: format!("invalid: {error}"),
            }])
        };
        let message =
            DynamicMessage::decode(self.message.clone(), data).map_err(|e| invalid(&e))?;
        let options = SerializeOptions::new()
            .use_proto_field_name(true)
            .stringify_64_bit_integers(false)
            .skip_default_fields(false);
        let json = message
            .serialize_with_options(serde_json::value::Serializer, &options)
            .map_err(|e| invalid(&e))?;
        Ok(cel::Value::from_json(&json))
    }

    /// Whether checking data of `bytes` bytes (with `old` of as many, when `with_old`) is cheap
    /// enough to do where the request is handled rather than on the rule pool: the data is
    /// small and the rules' worst case on data that small is at most [`cel::INLINE_UNITS`].
    pub(crate) fn checks_inline(&self, bytes: usize, with_old: bool) -> bool {
        // Decided before the defaults are set: what they may add counts.
        bytes.saturating_add(self.defaults_bytes) as u64 <= cel::SMALL_DATA_BYTES
            && self
                .rules
                .iter()
                .filter(|rule| with_old || !rule.uses_old)
                .map(|rule| rule.program.small_estimate)
                .fold(0u64, u64::saturating_add)
                <= cel::INLINE_UNITS
    }

    /// Whether any rule reads `old` (the write path then checks on the stored object).
    pub(crate) fn has_transition_rules(&self) -> bool {
        self.rules.iter().any(|rule| rule.uses_old)
    }
}

/// Where a rule's violation is reported.
fn rule_field(field: &str) -> String {
    if field.is_empty() {
        "resource.data".to_owned()
    } else {
        format!("resource.data.{field}")
    }
}

/// The value at a dot path of field names (the whole value for an empty path).
fn value_at<'v>(value: &'v cel::Value, path: &str) -> Option<&'v cel::Value> {
    if path.is_empty() {
        return Some(value);
    }
    path.split('.').try_fold(value, |value, name| match value {
        cel::Value::Map(map) => map.get(&cel::Key::String(name.into())),
        _ => None,
    })
}

fn compile_rule(
    index: usize,
    rule: &pb::Rule,
    message: &MessageDescriptor,
) -> Result<Rule, String> {
    let at = format!("data.rules[{index}]");
    for (what, text) in [
        ("expression", &rule.expression),
        ("message", &rule.message),
        ("field", &rule.field),
    ] {
        if text.len() > MAX_RULE_TEXT {
            return Err(format!(
                "{at}.{what} is {} bytes; at most {MAX_RULE_TEXT}",
                text.len()
            ));
        }
    }
    if rule.expression.trim().is_empty() {
        return Err(format!("{at}.expression is required"));
    }
    if rule.message.trim().is_empty() {
        return Err(format!(
            "{at}.message is required: what a violation says to the writer"
        ));
    }
    let expression = cel::parse(&rule.expression).map_err(|why| {
        format!(
            "{at}.expression {:?} does not compile: {why}",
            rule.expression
        )
    })?;
    // Measured without recursion, before anything recurses over it.
    let nesting = nesting_depth(&expression);
    if nesting > MAX_RULE_DEPTH {
        return Err(format!(
            "{at}.expression nests {nesting} levels deep; at most {MAX_RULE_DEPTH} (split it into several rules)"
        ));
    }
    let mut unknown = BTreeSet::new();
    let mut uses_old = false;
    walk(&expression, message, &mut unknown, &mut uses_old);
    if !unknown.is_empty() {
        return Err(format!(
            "{at}.expression {:?} names unknown fields: {}",
            rule.expression,
            unknown.into_iter().collect::<Vec<_>>().join(", ")
        ));
    }
    if !rule.field.is_empty() {
        check_field_path(message, &rule.field).map_err(|why| format!("{at}.field: {why}"))?;
    }
    let program = cel::prepare(expression, message, uses_old)
        .map_err(|why| format!("{at}.expression {:?}: {why}", rule.expression))?;
    if program.estimate > cel::RULE_BUDGET {
        return Err(format!(
            "{at}.expression {:?} may cost up to {} units on a resource of {} bytes, over the budget of {} per rule: a comprehension nested in another over the data's lists, or a large regex over long strings, costs the product of their sizes; check each list in a rule of its own, or keep literal lists short",
            rule.expression,
            program.estimate,
            cel::MAX_DATA_BYTES,
            cel::RULE_BUDGET
        ));
    }
    let reads = read_paths(&program.expression, message);
    Ok(Rule {
        index,
        program,
        message: rule.message.clone(),
        field: rule.field.clone(),
        uses_old,
        reads,
    })
}

/// How deeply an expression nests, found with an explicit stack (a rule written to nest
/// thousands of levels must not overflow the stack of whoever measures it).
pub(super) fn nesting_depth(expression: &Expression) -> usize {
    let mut deepest = 0;
    let mut pending: Vec<(&Expression, usize)> = vec![(expression, 1)];
    while let Some((node, depth)) = pending.pop() {
        deepest = deepest.max(depth);
        if depth <= MAX_RULE_DEPTH {
            pending.extend(children(node).into_iter().map(|child| (child, depth + 1)));
        }
    }
    deepest
}

/// The expressions directly inside `node`.
fn children(node: &Expression) -> Vec<&Expression> {
    match node {
        Expression::Arithmetic(a, _, b)
        | Expression::Relation(a, _, b)
        | Expression::Or(a, b)
        | Expression::And(a, b) => vec![a, b],
        Expression::Ternary(a, b, c) => vec![a, b, c],
        Expression::Unary(_, a) => vec![a],
        Expression::Member(target, member) => {
            let mut inside = vec![target.as_ref()];
            match member.as_ref() {
                Member::Index(index) => inside.push(index),
                Member::Fields(fields) => inside.extend(fields.iter().map(|(_, e)| e)),
                Member::Attribute(_) => {}
            }
            inside
        }
        Expression::FunctionCall(function, target, arguments) => {
            let mut inside = vec![function.as_ref()];
            inside.extend(target.as_deref());
            inside.extend(arguments.iter());
            inside
        }
        Expression::List(items) => items.iter().collect(),
        Expression::Map(entries) => entries.iter().flat_map(|(k, v)| [k, v]).collect(),
        Expression::Atom(_) | Expression::Ident(_) => Vec::new(),
    }
}

/// A dot-separated path of proto field names, each but the last a singular message.
pub(super) fn check_field_path(message: &MessageDescriptor, path: &str) -> Result<(), String> {
    let mut current = message.clone();
    let parts: Vec<&str> = path.split('.').collect();
    for (i, part) in parts.iter().enumerate() {
        let field = current
            .get_field_by_name(part)
            .ok_or_else(|| format!("{} has no field {part:?}", current.full_name()))?;
        if i + 1 < parts.len() {
            match field.kind() {
                Kind::Message(next) if !field.is_list() && !field.is_map() => current = next,
                _ => {
                    return Err(format!(
                        "{part} is not a message field, so {path} names nothing"
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Walks a rule: field selections on `self`/`old` that the message lacks go to `unknown`;
/// whether it reads `old` to `uses_old`.
/// The fields of `message` that `expression` reads from `self`, as dot paths: each chain of
/// selections from `self` as far as it goes through singular messages of the schema (a list, a
/// map, a scalar or a well-known type is compared whole); "" when `self` itself is read.
fn read_paths(expression: &Expression, message: &MessageDescriptor) -> BTreeSet<String> {
    let mut paths = BTreeSet::new();
    let mut pending = vec![expression];
    while let Some(node) = pending.pop() {
        match self_path(node, message) {
            Some(path) => {
                paths.insert(path);
            }
            None => pending.extend(children(node)),
        }
    }
    paths
}

/// The path a chain of attribute selections from `self` reads (see [`read_paths`]).
fn self_path(node: &Expression, message: &MessageDescriptor) -> Option<String> {
    let mut names = Vec::new();
    let mut at = node;
    loop {
        match at {
            Expression::Ident(name) if name.as_str() == "self" => break,
            Expression::Member(inner, member) => match member.as_ref() {
                Member::Attribute(name) => {
                    names.push(name.as_str());
                    at = inner;
                }
                _ => return None,
            },
            _ => return None,
        }
    }
    names.reverse();
    let mut of = message.clone();
    let mut path: Vec<&str> = Vec::new();
    for name in names {
        let Some(field) = of.get_field_by_name(name) else {
            break;
        };
        path.push(name);
        match field.kind() {
            Kind::Message(next)
                if !field.is_list()
                    && !field.is_map()
                    && !next.full_name().starts_with("google.protobuf.") =>
            {
                of = next;
            }
            _ => break,
        }
    }
    Some(path.join("."))
}

pub(super) fn walk(
    expression: &Expression,
    message: &MessageDescriptor,
    unknown: &mut BTreeSet<String>,
    uses_old: &mut bool,
) {
    let mut pending = vec![expression];
    while let Some(node) = pending.pop() {
        match node {
            Expression::Member(target, member) => {
                if let Member::Attribute(name) = member.as_ref()
                    && let Some(of) = selected_message(target, message, uses_old)
                    && of.get_field_by_name(name).is_none()
                {
                    unknown.insert(format!("{} of {}", name, of.full_name()));
                }
            }
            Expression::Ident(name) if name.as_str() == "old" => *uses_old = true,
            _ => {}
        }
        pending.extend(children(node));
    }
}

/// The message a selection's target is, when it is `self`/`old` or a chain of singular message
/// fields from them.
fn selected_message(
    target: &Expression,
    message: &MessageDescriptor,
    uses_old: &mut bool,
) -> Option<MessageDescriptor> {
    use Expression as E;
    match target {
        E::Ident(name) if name.as_str() == "self" => Some(message.clone()),
        E::Ident(name) if name.as_str() == "old" => {
            *uses_old = true;
            Some(message.clone())
        }
        E::Member(inner, member) => {
            let Member::Attribute(name) = member.as_ref() else {
                return None;
            };
            let of = selected_message(inner, message, uses_old)?;
            let field = of.get_field_by_name(name)?;
            match field.kind() {
                Kind::Message(next) if !field.is_list() && !field.is_map() => Some(next),
                _ => None,
            }
        }
        _ => None,
    }
}

fn compile_default(
    message: &MessageDescriptor,
    default: &pb::Default,
) -> Result<(FieldDescriptor, prost_reflect::Value), String> {
    let field = message.get_field_by_name(&default.field).ok_or_else(|| {
        format!(
            "field {:?}: {} has no such field",
            default.field,
            message.full_name()
        )
    })?;
    if field
        .containing_oneof()
        .is_some_and(|oneof| !oneof.is_synthetic())
    {
        return Err(format!(
            "field {:?} is a member of oneof {}: a default there would replace whichever member a writer set",
            default.field,
            field
                .containing_oneof()
                .map(|o| o.name().to_owned())
                .unwrap_or_default()
        ));
    }
    let value: serde_json::Value = serde_json::from_str(&default.value).map_err(|error| {
        format!(
            "value {:?} of {} is not JSON ({error}); a string is written \"\\\"EUR\\\"\"",
            default.value, default.field
        )
    })?;
    let document = serde_json::json!({ field.json_name(): value });
    let parsed = DynamicMessage::deserialize(message.clone(), document).map_err(|error| {
        format!(
            "value {} does not fit field {} ({}): {error}",
            default.value,
            default.field,
            field_type_name(&field)
        )
    })?;
    if !parsed.has_field(&field) {
        return Err(format!(
            "value {} of {} is the field's zero value, which is what an unset field reads as already",
            default.value, default.field
        ));
    }
    let value = parsed.get_field(&field).into_owned();
    Ok((field, value))
}

/// Whether `new` may replace `old` (DESIGN §15): the same group, version, kind and scope, and a
/// wire-compatible schema — fields and enum values may be added, none removed, renumbered,
/// renamed, retyped or changed in cardinality. Every problem, each naming the field.
pub(crate) fn check_update(old: &CompiledType, new: &CompiledType) -> Result<(), String> {
    let mut problems = Vec::new();
    if old.resource_type != new.resource_type {
        problems.push(format!(
            "data.group, group_version and kind cannot change ({} → {}): add a version to data.versions instead (DESIGN §15.1)",
            resource::gvk(&old.resource_type),
            resource::gvk(&new.resource_type)
        ));
    }
    if old.scope != new.scope {
        problems.push(format!(
            "data.scope cannot change ({} → {}): stored resources live where the old scope put them",
            old.scope.name(),
            new.scope.name()
        ));
    }
    compare_messages(&old.message, &new.message, &mut problems);
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{}; a breaking change is a new version of the Type (add it to data.versions, DESIGN §15.1)",
            problems.join("; ")
        ))
    }
}

/// Compares every message reachable from `old` with its counterpart in `new`, with an explicit
/// stack (a schema may chain thousands of messages; nothing here recurses over them).
fn compare_messages(old: &MessageDescriptor, new: &MessageDescriptor, problems: &mut Vec<String>) {
    let mut seen = BTreeSet::new();
    let mut pending = vec![(old.clone(), new.clone())];
    while let Some((old, new)) = pending.pop() {
        if !seen.insert(old.full_name().to_owned()) {
            continue;
        }
        let by_number: HashMap<u32, FieldDescriptor> =
            new.fields().map(|field| (field.number(), field)).collect();
        for field in old.fields() {
            let name = format!("{}.{}", old.full_name(), field.name());
            let Some(now) = by_number.get(&field.number()) else {
                match new.get_field_by_name(field.name()) {
                    Some(moved) => problems.push(format!(
                        "field {name} changes its number from {} to {}",
                        field.number(),
                        moved.number()
                    )),
                    None => problems.push(format!(
                        "field {name} (number {}) is removed",
                        field.number()
                    )),
                }
                continue;
            };
            if now.name() != field.name() {
                problems.push(format!(
                    "field {name} (number {}) is renamed to {}",
                    field.number(),
                    now.name()
                ));
            }
            let (was, is) = (field_type_name(&field), field_type_name(now));
            if was != is {
                problems.push(format!("field {name} changes type from {was} to {is}"));
            } else if field.is_list() != now.is_list() || field.is_map() != now.is_map() {
                problems.push(format!("field {name} changes cardinality"));
            } else {
                match (field.kind(), now.kind()) {
                    (Kind::Message(a), Kind::Message(b)) => pending.push((a, b)),
                    (Kind::Enum(a), Kind::Enum(b)) => {
                        let kept: BTreeSet<i32> = b.values().map(|v| v.number()).collect();
                        for value in a.values().filter(|v| !kept.contains(&v.number())) {
                            problems.push(format!(
                                "enum value {} ({}) of {} is removed",
                                value.name(),
                                value.number(),
                                a.full_name()
                            ));
                        }
                    }
                    _ => {}
                }
            }
        }
    }
}

/// A registered type's pieces the registry keeps.
#[derive(Debug, Clone)]
pub(crate) struct Installed {
    /// The `registry.v1.Type` resource's name.
    pub name: String,
    /// The stored Type's version when this node applied it: what a write checked against
    /// this registration is fenced on (DESIGN §15).
    pub version: String,
    /// This version of the Type, compiled.
    pub compiled: Arc<CompiledType>,
    /// Every version of the Type (one for a single-version Type), and how to convert.
    pub family: Arc<super::versions::Family>,
    /// Whether its Type is marked for deletion.
    pub deleting: bool,
}

impl Installed {
    /// The warning answers in this version carry, if it is deprecated.
    pub(crate) fn deprecation(&self) -> Option<&str> {
        self.family
            .version(&self.compiled.resource_type.group_version)
            .filter(|v| v.deprecated)
            .map(|v| v.warning.as_str())
    }
}

#[cfg(test)]
pub(crate) mod tests;
