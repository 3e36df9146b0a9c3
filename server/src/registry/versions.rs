//! Types that evolve (DESIGN §15.1): a Type that serves several versions of one group and kind,
//! stores its objects in one of them, and converts between them on the server.
//!
//! A version is compiled like a single-version Type ([`dynamic::compile`] of the Type it
//! would be on its own: [`version_type`]). Conversion between two versions carries every field
//! over whose number and type are the same in both (enums and messages compared by name
//! without their package, nested messages field by field), then sets each field a
//! `conversions` entry names to its CEL expression's value over the source object. A version
//! that is not the storage version converts through it (the hub). Fields of the target that
//! nothing sets keep the value they have in `base` (the stored object, on a write): an older
//! client updating an object through its version does not wipe what only newer versions have.
//!
//! When a Type is written its versions must round-trip: a generated sample of every served
//! version, with every field set, converted to the storage version and back, must come back
//! equal — otherwise the Type is refused naming the field that does not survive.

use std::collections::BTreeSet;
use std::sync::Arc;

use prost::Message as _;
use prost_reflect::{
    DynamicMessage, FieldDescriptor, Kind, MapKey, MessageDescriptor, ReflectMessage, Value,
};
use proto::registry::v1 as pb;

use super::cel::{self, EvalError, Meter};
use super::dynamic::{self, CompiledType, MAX_RULE_DEPTH};

/// Most versions one Type may serve or keep.
pub(crate) const MAX_VERSIONS: usize = 16;
/// Most conversions of one Type.
pub(crate) const MAX_CONVERSIONS: usize = 256;
/// Most columns of one version.
pub(crate) const MAX_COLUMNS: usize = 16;
/// Longest conversion expression.
const MAX_EXPRESSION_TEXT: usize = 4096;
/// Column types `resctl get` knows how to show.
pub(crate) const COLUMN_TYPES: [&str; 5] = ["string", "integer", "number", "boolean", "date"];

/// One version of a multi-version Type, compiled.
#[derive(Debug)]
pub(crate) struct Version {
    pub name: String,
    pub served: bool,
    pub deprecated: bool,
    /// What answers in this version warn with (the Type's message, or a default).
    pub warning: String,
    pub compiled: Arc<CompiledType>,
    /// What `resctl get` shows for it.
    pub columns: Vec<pb::Column>,
}

/// A field of one version made from an object of another.
#[derive(Debug)]
struct Conversion {
    index: usize,
    from: String,
    to: String,
    /// The target field's path, by proto names.
    path: Vec<String>,
    program: cel::Program,
}

/// Every version of a Type and how to convert between them.
#[derive(Debug)]
pub(crate) struct Family {
    pub storage: String,
    pub versions: Vec<Version>,
    conversions: Vec<Conversion>,
    /// How much of each object's history is kept.
    pub history: crate::resource::Retention,
}

/// Most versions, seconds and bytes a Type's `history` may keep per object.
pub(crate) const MAX_HISTORY_VERSIONS: u32 = 10_000;
pub(crate) const MAX_HISTORY_SECONDS: u64 = 366 * 24 * 3600;
pub(crate) const MAX_HISTORY_BYTES: u64 = 64 << 20;

/// The retention a Type's `history` asks for (unset fields: the defaults).
pub(crate) fn retention_of(t: &pb::Type) -> crate::resource::Retention {
    let defaults = crate::resource::Retention::default();
    let Some(history) = &t.history else {
        return defaults;
    };
    crate::resource::Retention {
        versions: history.versions.unwrap_or(defaults.versions),
        seconds: history.seconds.unwrap_or(defaults.seconds),
        bytes: history.bytes.unwrap_or(defaults.bytes),
    }
}

/// What is wrong with a Type's `history`.
pub(crate) fn history_problems(t: &pb::Type) -> Vec<String> {
    let retention = retention_of(t);
    let mut problems = Vec::new();
    if retention.versions > MAX_HISTORY_VERSIONS {
        problems.push(format!(
            "data.history.versions is {}; at most {MAX_HISTORY_VERSIONS}",
            retention.versions
        ));
    }
    if retention.seconds > MAX_HISTORY_SECONDS {
        problems.push(format!(
            "data.history.seconds is {}; at most {MAX_HISTORY_SECONDS} (366 days)",
            retention.seconds
        ));
    }
    if retention.bytes > MAX_HISTORY_BYTES {
        problems.push(format!(
            "data.history.bytes is {}; at most {MAX_HISTORY_BYTES} (64 MiB)",
            retention.bytes
        ));
    }
    problems
}

/// Why an object could not be converted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct ConversionError(pub String);

/// What is wrong with `columns` (each problem naming its field under `at`).
pub(crate) fn column_problems(at: &str, columns: &[pb::Column]) -> Vec<String> {
    let mut problems = Vec::new();
    if columns.len() > MAX_COLUMNS {
        problems.push(format!(
            "{at} has {} columns; at most {MAX_COLUMNS}",
            columns.len()
        ));
    }
    let mut names = BTreeSet::new();
    for (index, column) in columns.iter().enumerate() {
        let here = format!("{at}[{index}]");
        if column.name.trim().is_empty() || column.name.len() > 64 {
            problems.push(format!("{here}.name is required (at most 64 bytes)"));
        } else if !names.insert(column.name.to_uppercase()) {
            problems.push(format!("{here}.name {:?} is listed twice", column.name));
        }
        let path_ok = column.json_path.starts_with('.')
            && column.json_path.len() <= 256
            && column.json_path[1..].split('.').all(|part| {
                !part.is_empty()
                    && part
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            });
        if !path_ok {
            problems.push(format!(
                "{here}.json_path {:?} must be a path in the resctl document: `.data.sku`, `.metadata.team`",
                column.json_path
            ));
        }
        if !COLUMN_TYPES.contains(&column.r#type.as_str()) {
            problems.push(format!(
                "{here}.type {:?} must be one of {}",
                column.r#type,
                COLUMN_TYPES.join(", ")
            ));
        }
    }
    problems
}

/// The single-version Type that version `v` of `t` would be on its own.
pub(crate) fn version_type(t: &pb::Type, v: &pb::TypeVersion) -> pb::Type {
    pb::Type {
        group: t.group.clone(),
        group_version: v.name.clone(),
        kind: t.kind.clone(),
        scope: t.scope,
        description: t.description.clone(),
        proto: v.proto.clone(),
        descriptor_set: v.descriptor_set.clone(),
        rules: v.rules.clone(),
        defaults: v.defaults.clone(),
        versions: Vec::new(),
        storage_version: String::new(),
        conversions: Vec::new(),
        columns: v.columns.clone(),
        history: t.history,
    }
}

/// The versions of `t` as a multi-version Type sees them: its `versions`, or for a
/// single-version Type none.
pub(crate) fn is_multi_version(t: &pb::Type) -> bool {
    !t.versions.is_empty()
}

/// Checks a multi-version Type as written and compiles every version: the Type to store (each
/// version's `descriptor_set` the compiler's), or every problem found, each naming its field.
pub(crate) fn compile(t: &pb::Type) -> Result<pb::Type, String> {
    let mut problems = Vec::new();
    for (field, set) in [
        ("group_version", !t.group_version.is_empty()),
        ("proto", !t.proto.is_empty()),
        ("rules", !t.rules.is_empty()),
        ("defaults", !t.defaults.is_empty()),
        ("columns", !t.columns.is_empty()),
    ] {
        if set {
            problems.push(format!(
                "data.{field} must be empty when data.versions is set: each version has its own"
            ));
        }
    }
    if t.versions.len() > MAX_VERSIONS {
        problems.push(format!(
            "data.versions has {} versions; a type may have at most {MAX_VERSIONS}",
            t.versions.len()
        ));
    }
    if t.conversions.len() > MAX_CONVERSIONS {
        problems.push(format!(
            "data.conversions has {} entries; a type may have at most {MAX_CONVERSIONS}",
            t.conversions.len()
        ));
    }
    let mut names = BTreeSet::new();
    for (index, version) in t.versions.iter().enumerate() {
        if !names.insert(version.name.as_str()) {
            problems.push(format!(
                "data.versions[{index}].name {:?} is listed twice",
                version.name
            ));
        }
        if version.name.contains('.') {
            problems.push(format!(
                "data.versions[{index}].name {:?} must be a bare version (v1, v2beta1), not a group version",
                version.name
            ));
        }
    }
    if !t.versions.iter().any(|v| v.served) {
        problems.push(
            "data.versions: no version is served; set served: true on at least one".to_owned(),
        );
    }
    if t.storage_version.is_empty() {
        problems.push(format!(
            "data.storage_version is required with data.versions: one of {}",
            names.iter().copied().collect::<Vec<_>>().join(", ")
        ));
    } else if !names.contains(t.storage_version.as_str()) {
        problems.push(format!(
            "data.storage_version {:?} is not one of data.versions ({})",
            t.storage_version,
            names.iter().copied().collect::<Vec<_>>().join(", ")
        ));
    }
    for (index, conversion) in t.conversions.iter().enumerate() {
        if conversion.from_version != t.storage_version
            && conversion.to_version != t.storage_version
            && conversion.from_version != conversion.to_version
            && names.contains(conversion.from_version.as_str())
            && names.contains(conversion.to_version.as_str())
        {
            problems.push(format!(
                "data.conversions[{index}] converts {} to {}, neither the storage version {}: every conversion goes to or from the storage version ({} to {} goes through {}), so this one would never run; write it as {} → {} and {} → {}",
                conversion.from_version,
                conversion.to_version,
                t.storage_version,
                conversion.from_version,
                conversion.to_version,
                t.storage_version,
                conversion.from_version,
                t.storage_version,
                t.storage_version,
                conversion.to_version
            ));
        }
    }
    if !problems.is_empty() {
        return Err(problems.join("; "));
    }
    let mut compiled = t.clone();
    for (index, version) in t.versions.iter().enumerate() {
        let alone = version_type(t, version);
        match dynamic::compile(&alone) {
            Ok(done) => compiled.versions[index].descriptor_set = done.descriptor_set,
            Err(why) => problems.push(
                why.split("; ")
                    .map(|problem| {
                        problem.replacen("data.", &format!("data.versions[{index}]."), 1)
                    })
                    .collect::<Vec<_>>()
                    .join("; "),
            ),
        }
    }
    if !problems.is_empty() {
        return Err(problems.join("; "));
    }
    let family = Family::load(&compiled)?;
    family.check_round_trips()?;
    Ok(compiled)
}

impl Family {
    /// Builds any stored (compiled) Type: a single-version Type is a family of one version,
    /// served and stored, with nothing to convert.
    pub(crate) fn load_any(t: &pb::Type) -> Result<Family, String> {
        if is_multi_version(t) {
            return Family::load(t);
        }
        let compiled = CompiledType::load(t)?;
        Ok(Family {
            storage: t.group_version.clone(),
            versions: vec![Version {
                name: t.group_version.clone(),
                served: true,
                deprecated: false,
                warning: String::new(),
                compiled: Arc::new(compiled),
                columns: t.columns.clone(),
            }],
            conversions: Vec::new(),
            history: retention_of(t),
        })
    }

    /// The descriptors every version holds, in bytes (what `--max-schema-bytes` counts).
    pub(crate) fn descriptor_bytes(&self) -> usize {
        self.versions
            .iter()
            .map(|v| v.compiled.descriptor_set.len())
            .sum()
    }

    /// Whether converting data of `bytes` bytes is cheap enough to do where the request is
    /// handled rather than on the rule pool (no CEL, or small data under cheap conversions).
    pub(crate) fn converts_inline(&self, bytes: usize) -> bool {
        self.conversions.is_empty()
            || (bytes as u64 <= cel::SMALL_DATA_BYTES
                && self
                    .conversions
                    .iter()
                    .map(|c| c.program.small_estimate)
                    .fold(0u64, u64::saturating_add)
                    <= cel::INLINE_UNITS)
    }

    /// Whether any conversion is a CEL expression (others only carry fields over).
    pub(crate) fn has_cel_conversions(&self) -> bool {
        !self.conversions.is_empty()
    }

    /// Whether objects may be stored in one version and asked for in another.
    pub(crate) fn converts(&self) -> bool {
        self.versions.len() > 1
    }

    /// The served versions.
    pub(crate) fn served(&self) -> impl Iterator<Item = &Version> {
        self.versions.iter().filter(|v| v.served)
    }

    /// Builds the versions and conversions of a stored (compiled) multi-version Type.
    pub(crate) fn load(t: &pb::Type) -> Result<Family, String> {
        let mut problems = Vec::new();
        let mut versions = Vec::new();
        for (index, version) in t.versions.iter().enumerate() {
            match CompiledType::load(&version_type(t, version)) {
                Ok(compiled) => versions.push(Version {
                    name: version.name.clone(),
                    served: version.served,
                    deprecated: version.deprecated,
                    warning: if version.deprecation_message.is_empty() {
                        format!("{}.{}.{} is deprecated", t.group, version.name, t.kind)
                    } else {
                        version.deprecation_message.clone()
                    },
                    compiled: Arc::new(compiled),
                    columns: version.columns.clone(),
                }),
                Err(why) => problems.push(format!("data.versions[{index}]: {why}")),
            }
        }
        if !problems.is_empty() {
            return Err(problems.join("; "));
        }
        if !versions.iter().any(|v| v.name == t.storage_version) {
            return Err(format!(
                "data.storage_version {:?} is not one of data.versions",
                t.storage_version
            ));
        }
        let mut conversions = Vec::new();
        for (index, conversion) in t.conversions.iter().enumerate() {
            match compile_conversion(index, conversion, &versions) {
                Ok(done) => conversions.push(done),
                Err(why) => problems.push(why),
            }
        }
        if !problems.is_empty() {
            return Err(problems.join("; "));
        }
        Ok(Family {
            storage: t.storage_version.clone(),
            versions,
            conversions,
            history: retention_of(t),
        })
    }

    /// The version named `name`.
    pub(crate) fn version(&self, name: &str) -> Option<&Version> {
        self.versions.iter().find(|v| v.name == name)
    }

    /// The storage version.
    pub(crate) fn storage_version(&self) -> &Version {
        self.version(&self.storage)
            .expect("a family is loaded only with its storage version")
    }

    /// `data` of version `from` as version `to`: through the storage version unless one of the
    /// two is it. Fields of `to` that nothing sets keep their value in `base` (an object of
    /// version `to`), when given.
    pub(crate) fn convert(
        &self,
        data: &[u8],
        from: &str,
        to: &str,
        base: Option<&[u8]>,
        meter: &mut Meter,
    ) -> Result<Vec<u8>, ConversionError> {
        if from == to {
            return Ok(data.to_vec());
        }
        if from != self.storage && to != self.storage {
            let hub = self.step(data, from, &self.storage, None, meter)?;
            return self.step(&hub, &self.storage, to, base, meter);
        }
        self.step(data, from, to, base, meter)
    }

    fn step(
        &self,
        data: &[u8],
        from: &str,
        to: &str,
        base: Option<&[u8]>,
        meter: &mut Meter,
    ) -> Result<Vec<u8>, ConversionError> {
        let source_version = self.version(from).ok_or_else(|| {
            ConversionError(format!("version {from:?} is not a version of this type"))
        })?;
        let target_version = self.version(to).ok_or_else(|| {
            ConversionError(format!("version {to:?} is not a version of this type"))
        })?;
        let source = DynamicMessage::decode(source_version.compiled.message.clone(), data)
            .map_err(|error| {
                ConversionError(format!("resource.data does not decode as {from}: {error}"))
            })?;
        let target_message = target_version.compiled.message.clone();
        let base = match base {
            Some(bytes) => Some(
                DynamicMessage::decode(target_message.clone(), bytes).map_err(|error| {
                    ConversionError(format!("the stored data does not decode as {to}: {error}"))
                })?,
            ),
            None => None,
        };
        let mut target = carry(&source, &target_message, base.as_ref());
        let conversions: Vec<&Conversion> = self
            .conversions
            .iter()
            .filter(|c| c.from == from && c.to == to)
            .collect();
        if !conversions.is_empty() {
            let this = source_version
                .compiled
                .cel_value(data)
                .map_err(|failure| ConversionError(failure.to_string()))?;
            for conversion in conversions {
                let mut step_meter = Meter::new(meter.left().min(cel::RULE_BUDGET));
                let value = cel::Evaluator::new(
                    &conversion.program,
                    vec![(Arc::new("self".to_owned()), this.clone())],
                    &mut step_meter,
                )
                .run();
                meter.spend(step_meter.used());
                let value = value.map_err(|error| {
                    let why = match error {
                        EvalError::OverBudget { limit } => {
                            format!("it ran out of its budget of {limit} units")
                        }
                        EvalError::Runtime(why) => why,
                    };
                    ConversionError(format!(
                        "conversions[{}] ({from} → {to}, field {}) failed: {why}",
                        conversion.index,
                        conversion.path.join(".")
                    ))
                })?;
                set_path(&mut target, &conversion.path, &value).map_err(|why| {
                    ConversionError(format!(
                        "conversions[{}] ({from} → {to}, field {}): {why}",
                        conversion.index,
                        conversion.path.join(".")
                    ))
                })?;
            }
        }
        Ok(target.encode_to_vec())
    }

    /// Every served version must survive the trip to the storage version and back: a sample
    /// with every field set comes back equal, or the problem names the field that does not.
    pub(crate) fn check_round_trips(&self) -> Result<(), String> {
        let mut problems = Vec::new();
        for version in self.versions.iter().filter(|v| v.served) {
            if version.name == self.storage {
                continue;
            }
            for sample in samples(&version.compiled.message) {
                let bytes = sample.encode_to_vec();
                let mut meter = Meter::new(cel::REQUEST_BUDGET);
                let back = self
                    .convert(&bytes, &version.name, &self.storage, None, &mut meter)
                    .and_then(|stored| {
                        self.convert(&stored, &self.storage, &version.name, None, &mut meter)
                    });
                let problem = match back {
                    Err(error) => Some(format!(
                        "data.versions: a sample {} does not convert to the storage version {} and back: {error}",
                        version.name, self.storage
                    )),
                    Ok(back) => {
                        let back = DynamicMessage::decode(
                            version.compiled.message.clone(),
                            back.as_slice(),
                        )
                        .map_err(|error| error.to_string())?;
                        first_difference(&sample, &back).map(|field| format!(
                            "data.versions: field {field} of {} does not survive the round trip {} → {} → {}: give it the same number and type in {}, or add conversions both ways",
                            version.name, version.name, self.storage, version.name, self.storage
                        ))
                    }
                };
                if let Some(problem) = problem {
                    // One problem per version: the first sample that shows it.
                    problems.push(problem);
                    break;
                }
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }
}

/// Whether `new` may replace `old` (DESIGN §15, §15.1): the same group, kind and scope; every
/// version both have stays wire-compatible ([`dynamic::check_update`]); the storage version of
/// `old` is not removed (its objects are stored in it until a migration rewrites them).
pub(crate) fn check_update(old: &Family, new: &Family) -> Result<(), String> {
    let mut problems = Vec::new();
    let (a, b) = (old.storage_version(), new.storage_version());
    let (ta, tb) = (&a.compiled.resource_type, &b.compiled.resource_type);
    if ta.group != tb.group || ta.kind != tb.kind {
        problems.push(format!(
            "data.group and kind cannot change ({}.{} → {}.{}): register a new Type for another kind",
            ta.group, ta.kind, tb.group, tb.kind
        ));
    }
    if a.compiled.scope != b.compiled.scope {
        problems.push(format!(
            "data.scope cannot change ({} → {}): stored resources live where the old scope put them",
            a.compiled.scope.name(),
            b.compiled.scope.name()
        ));
    }
    if !problems.is_empty() {
        return Err(problems.join("; "));
    }
    for version in &old.versions {
        match new.version(&version.name) {
            Some(next) => {
                if let Err(why) = dynamic::check_update(&version.compiled, &next.compiled) {
                    problems.push(if new.converts() {
                        format!("version {}: {why}", version.name)
                    } else {
                        why
                    });
                }
            }
            None if version.name == old.storage => problems.push(format!(
                "data.versions: {} is the storage version, so objects are stored in it: set storage_version to another version first and remove {} once the migration has rewritten them",
                version.name, version.name
            )),
            None => {}
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

fn compile_conversion(
    index: usize,
    conversion: &pb::Conversion,
    versions: &[Version],
) -> Result<Conversion, String> {
    let at = format!("data.conversions[{index}]");
    let find = |name: &str, what: &str| {
        versions.iter().find(|v| v.name == name).ok_or_else(|| {
            format!(
                "{at}.{what} {name:?} is not one of data.versions ({})",
                versions
                    .iter()
                    .map(|v| v.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
    };
    let source = find(&conversion.from_version, "from_version")?;
    let target = find(&conversion.to_version, "to_version")?;
    if source.name == target.name {
        return Err(format!(
            "{at}: from_version and to_version are both {:?}",
            source.name
        ));
    }
    if conversion.expression.len() > MAX_EXPRESSION_TEXT {
        return Err(format!(
            "{at}.expression is {} bytes; at most {MAX_EXPRESSION_TEXT}",
            conversion.expression.len()
        ));
    }
    if conversion.field.is_empty() {
        return Err(format!(
            "{at}.field is required: the field of {} the expression sets",
            target.name
        ));
    }
    dynamic::check_field_path(&target.compiled.message, &conversion.field)
        .map_err(|why| format!("{at}.field: {why} (a path in {})", target.name))?;
    let expression = cel::parse(&conversion.expression).map_err(|why| {
        format!(
            "{at}.expression {:?} does not compile: {why}",
            conversion.expression
        )
    })?;
    let nesting = dynamic::nesting_depth(&expression);
    if nesting > MAX_RULE_DEPTH {
        return Err(format!(
            "{at}.expression nests {nesting} levels deep; at most {MAX_RULE_DEPTH}"
        ));
    }
    let mut unknown = BTreeSet::new();
    let mut uses_old = false;
    dynamic::walk(
        &expression,
        &source.compiled.message,
        &mut unknown,
        &mut uses_old,
    );
    if uses_old {
        return Err(format!(
            "{at}.expression reads `old`: a conversion sees only `self`, the {} object",
            source.name
        ));
    }
    if !unknown.is_empty() {
        return Err(format!(
            "{at}.expression {:?} names unknown fields of {}: {}",
            conversion.expression,
            source.name,
            unknown.into_iter().collect::<Vec<_>>().join(", ")
        ));
    }
    let program = cel::prepare(expression, &source.compiled.message, false)
        .map_err(|why| format!("{at}.expression {:?}: {why}", conversion.expression))?;
    if program.estimate > cel::RULE_BUDGET {
        return Err(format!(
            "{at}.expression {:?} may cost up to {} units, over the budget of {} per expression",
            conversion.expression,
            program.estimate,
            cel::RULE_BUDGET
        ));
    }
    Ok(Conversion {
        index,
        from: source.name.clone(),
        to: target.name.clone(),
        path: conversion.field.split('.').map(str::to_owned).collect(),
        program,
    })
}

/// Whether a field of one version carries over to a field of another with the same number.
fn carries(from: &FieldDescriptor, to: &FieldDescriptor) -> bool {
    if from.is_map() != to.is_map() || from.is_list() != to.is_list() {
        return false;
    }
    if from.is_map() {
        let (Kind::Message(a), Kind::Message(b)) = (from.kind(), to.kind()) else {
            return false;
        };
        return kinds_carry(
            &a.map_entry_key_field().kind(),
            &b.map_entry_key_field().kind(),
        ) && kinds_carry(
            &a.map_entry_value_field().kind(),
            &b.map_entry_value_field().kind(),
        );
    }
    kinds_carry(&from.kind(), &to.kind())
}

/// Same scalar kind; enums and messages of the same name (without the package).
fn kinds_carry(from: &Kind, to: &Kind) -> bool {
    match (from, to) {
        (Kind::Enum(a), Kind::Enum(b)) => a.name() == b.name(),
        (Kind::Message(a), Kind::Message(b)) => a.name() == b.name(),
        (a, b) => std::mem::discriminant(a) == std::mem::discriminant(b),
    }
}

/// `source` as a message of `target`: every field that carries over by number, the others from
/// `base` (or unset).
fn carry(
    source: &DynamicMessage,
    target: &MessageDescriptor,
    base: Option<&DynamicMessage>,
) -> DynamicMessage {
    let mut out = match base {
        Some(base) => base.clone(),
        None => DynamicMessage::new(target.clone()),
    };
    let source_message = source.descriptor();
    for field in target.fields() {
        let Some(from) = source_message.get_field(field.number()) else {
            continue;
        };
        if !carries(&from, &field) {
            continue;
        }
        if !source.has_field(&from) {
            out.clear_field(&field);
            continue;
        }
        let nested_base = base
            .filter(|base| base.has_field(&field))
            .map(|base| base.get_field(&field).into_owned());
        let value = carry_value(
            &source.get_field(&from),
            &field.kind(),
            nested_base.as_ref(),
        );
        out.set_field(&field, value);
    }
    out
}

/// A carried value; `base` is what the target held there (a write keeps what the source
/// version cannot set, in messages inside lists and maps too: item by index, value by key).
fn carry_value(value: &Value, to: &Kind, base: Option<&Value>) -> Value {
    match (value, to) {
        (Value::Message(message), Kind::Message(target)) => {
            if message.descriptor().full_name() == target.full_name() {
                value.clone()
            } else {
                let base = base.and_then(Value::as_message);
                Value::Message(carry(message, target, base))
            }
        }
        (Value::List(items), _) => {
            let base = base.and_then(Value::as_list);
            Value::List(
                items
                    .iter()
                    .enumerate()
                    .map(|(index, item)| carry_value(item, to, base.and_then(|b| b.get(index))))
                    .collect(),
            )
        }
        (Value::Map(entries), Kind::Message(entry)) => {
            let value_kind = entry.map_entry_value_field().kind();
            let base = base.and_then(Value::as_map);
            Value::Map(
                entries
                    .iter()
                    .map(|(key, item)| {
                        (
                            key.clone(),
                            carry_value(item, &value_kind, base.and_then(|b| b.get(key))),
                        )
                    })
                    .collect(),
            )
        }
        _ => value.clone(),
    }
}

/// Sets the field at `path` of `target` (creating the messages on the way) to `value`: a CEL
/// value read as the field's JSON. `null` clears it.
fn set_path(
    target: &mut DynamicMessage,
    path: &[String],
    value: &cel::Value,
) -> Result<(), String> {
    let Some((last, parents)) = path.split_last() else {
        return Err("the path is empty".into());
    };
    let mut current = target;
    for name in parents {
        let field = current
            .descriptor()
            .get_field_by_name(name)
            .ok_or_else(|| format!("no field {name:?}"))?;
        let Value::Message(next) = current.get_field_mut(&field) else {
            return Err(format!("{name} is not a message"));
        };
        current = next;
    }
    let message = current.descriptor();
    let field = message
        .get_field_by_name(last)
        .ok_or_else(|| format!("no field {last:?}"))?;
    if matches!(value, cel::Value::Null) {
        current.clear_field(&field);
        return Ok(());
    }
    let json = serde_json::json!({ field.name(): to_json(value) });
    let parsed = DynamicMessage::deserialize(message, json).map_err(|error| {
        format!(
            "its value {value} does not fit the field ({}): {error}",
            proto::codec::field_type_name(&field)
        )
    })?;
    if parsed.has_field(&field) {
        current.set_field(&field, parsed.get_field(&field).into_owned());
    } else {
        current.clear_field(&field);
    }
    Ok(())
}

/// A CEL value as JSON (what a field of its type reads from).
fn to_json(value: &cel::Value) -> serde_json::Value {
    use base64::Engine as _;
    match value {
        cel::Value::Null => serde_json::Value::Null,
        cel::Value::Bool(b) => serde_json::Value::Bool(*b),
        cel::Value::Int(i) => serde_json::Value::from(*i),
        cel::Value::Uint(u) => serde_json::Value::from(*u),
        cel::Value::Double(d) => serde_json::Value::from(*d),
        cel::Value::String(s) => serde_json::Value::String(s.to_string()),
        cel::Value::Bytes(b) => {
            serde_json::Value::String(base64::engine::general_purpose::STANDARD.encode(b))
        }
        cel::Value::List(items) => serde_json::Value::Array(items.iter().map(to_json).collect()),
        cel::Value::Map(entries) => serde_json::Value::Object(
            entries
                .iter()
                .map(|(key, item)| {
                    let key = match key {
                        cel::Key::Bool(b) => b.to_string(),
                        cel::Key::Int(i) => i.to_string(),
                        cel::Key::Uint(u) => u.to_string(),
                        cel::Key::String(s) => s.to_string(),
                    };
                    (key, to_json(item))
                })
                .collect(),
        ),
    }
}

/// How deep [`sample`] fills nested messages (recursive types stop there).
const SAMPLE_DEPTH: usize = 4;

/// Most samples a version's round trip checks: one per member of the largest oneof, up to this.
const MAX_SAMPLES: usize = 64;

/// Samples of `message`, each with every field set to a value that is not its zero (one item in
/// each list and map), nested messages to [`SAMPLE_DEPTH`]; between them they set every member
/// of every oneof: the `k`th sets the `k`th member of each (the last of a smaller one), for as
/// many as the largest oneof has (at most [`MAX_SAMPLES`]).
pub(crate) fn samples(message: &MessageDescriptor) -> Vec<DynamicMessage> {
    let largest = message
        .parent_pool()
        .all_messages()
        .flat_map(|m| m.oneofs().map(|o| o.fields().len()).collect::<Vec<_>>())
        .max()
        .unwrap_or(1)
        .clamp(1, MAX_SAMPLES);
    (0..largest)
        .map(|choice| sample_at(message, 0, choice))
        .collect()
}

fn sample_at(message: &MessageDescriptor, depth: usize, choice: usize) -> DynamicMessage {
    let mut out = DynamicMessage::new(message.clone());
    if message.full_name().starts_with("google.protobuf.") {
        return out;
    }
    for field in message.fields() {
        if let Some(oneof) = field.containing_oneof().filter(|o| !o.is_synthetic()) {
            let members: Vec<u32> = oneof.fields().map(|f| f.number()).collect();
            let chosen = members[choice.min(members.len() - 1)];
            if field.number() != chosen {
                continue;
            }
        }
        let value = if field.is_map() {
            let Kind::Message(entry) = field.kind() else {
                continue;
            };
            let key = match sample_value(&entry.map_entry_key_field(), depth, choice) {
                Some(Value::String(s)) => MapKey::String(s),
                Some(Value::I32(i)) => MapKey::I32(i),
                Some(Value::I64(i)) => MapKey::I64(i),
                Some(Value::U32(i)) => MapKey::U32(i),
                Some(Value::U64(i)) => MapKey::U64(i),
                Some(Value::Bool(b)) => MapKey::Bool(b),
                _ => continue,
            };
            let Some(item) = sample_value(&entry.map_entry_value_field(), depth, choice) else {
                continue;
            };
            Value::Map([(key, item)].into_iter().collect())
        } else if field.is_list() {
            let Some(item) = sample_value(&field, depth, choice) else {
                continue;
            };
            Value::List(vec![item])
        } else {
            let Some(item) = sample_value(&field, depth, choice) else {
                continue;
            };
            item
        };
        out.set_field(&field, value);
    }
    out
}

fn sample_value(field: &FieldDescriptor, depth: usize, choice: usize) -> Option<Value> {
    let n = field.number();
    Some(match field.kind() {
        Kind::Double => Value::F64(f64::from(n) + 0.5),
        Kind::Float => Value::F32(n as f32 + 0.5),
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => Value::I32(n as i32 + 7),
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => Value::I64(i64::from(n) + 7),
        Kind::Uint32 | Kind::Fixed32 => Value::U32(n + 7),
        Kind::Uint64 | Kind::Fixed64 => Value::U64(u64::from(n) + 7),
        Kind::Bool => Value::Bool(true),
        Kind::String => Value::String(format!("sample-{}", field.name())),
        Kind::Bytes => Value::Bytes(bytes::Bytes::from(vec![1, 2, n as u8])),
        Kind::Enum(e) => Value::EnumNumber(
            e.values()
                .map(|v| v.number())
                .filter(|number| *number != 0)
                .max()
                .unwrap_or(0),
        ),
        Kind::Message(m) => {
            if depth >= SAMPLE_DEPTH {
                return None;
            }
            Value::Message(sample_at(&m, depth + 1, choice))
        }
    })
}

/// The first field (a dot path) whose value differs between two messages of one type.
pub(crate) fn first_difference(a: &DynamicMessage, b: &DynamicMessage) -> Option<String> {
    for field in a.descriptor().fields() {
        let (has_a, has_b) = (a.has_field(&field), b.has_field(&field));
        if has_a != has_b {
            return Some(field.name().to_owned());
        }
        if !has_a {
            continue;
        }
        let (va, vb) = (a.get_field(&field), b.get_field(&field));
        if va == vb {
            continue;
        }
        if let (Value::Message(ma), Value::Message(mb)) = (va.as_ref(), vb.as_ref())
            && let Some(inner) = first_difference(ma, mb)
        {
            return Some(format!("{}.{inner}", field.name()));
        }
        return Some(field.name().to_owned());
    }
    None
}

#[cfg(test)]
mod tests;
