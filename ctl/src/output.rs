//! Output rendering: aligned tables for people, YAML/JSON for scripts (stable field names), and
//! `name` for piping into other commands.

use std::io::Write;
use std::str::FromStr;
use std::sync::OnceLock;
use std::time::SystemTime;

use clap::ValueEnum;
use proto::client::describe;
use proto::codec::{Codec, gvk};
use proto::resource::v1::Resource;
use serde::Serialize;

use crate::jsonpath::JsonPath;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// Aligned columns
    Table,
    /// Aligned columns with uid, generation, finalizers and type
    Wide,
    /// YAML documents (resources re-apply cleanly)
    Yaml,
    /// JSON (lists are arrays; watch prints one object per line)
    Json,
    /// `group.version.Kind/name` per resource
    Name,
    /// The JSON output through a template (`-o jsonpath=TEMPLATE`)
    #[value(skip)]
    JsonPath,
    /// A table of the columns asked for (`-o custom-columns=NAME:PATH,…`)
    #[value(skip)]
    CustomColumns,
}

impl OutputFormat {
    pub fn is_structured(self) -> bool {
        matches!(
            self,
            OutputFormat::Yaml | OutputFormat::Json | OutputFormat::JsonPath
        )
    }
}

/// What `-o` takes: a format, `jsonpath=TEMPLATE` (kubectl's subset, see [`JsonPath`]) or
/// `custom-columns=NAME:PATH,…`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputSpec {
    pub format: OutputFormat,
    pub template: Option<JsonPath>,
    pub columns: Option<Vec<Column>>,
}

/// A column of `-o custom-columns`: its header and the JSONPath of its cells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    pub header: String,
    pub path: JsonPath,
}

/// `NAME:PATH,NAME:PATH,…` (kubectl's form; a path may be bare, `.data.name`, or braced).
pub fn parse_columns(spec: &str) -> Result<Vec<Column>, String> {
    let mut columns = Vec::new();
    for (index, part) in spec.split(',').enumerate() {
        let Some((header, path)) = part.split_once(':') else {
            return Err(format!(
                "custom-columns: column {} ({part:?}) is not NAME:PATH (e.g. NAME:.name,TEAM:.metadata.team)",
                index + 1
            ));
        };
        if header.trim().is_empty() || path.trim().is_empty() {
            return Err(format!(
                "custom-columns: column {} ({part:?}) needs a name and a path",
                index + 1
            ));
        }
        let path = path
            .trim()
            .parse::<JsonPath>()
            .map_err(|error| format!("custom-columns: column {}: {error}", index + 1))?;
        columns.push(Column {
            header: header.trim().to_uppercase(),
            path,
        });
    }
    Ok(columns)
}

impl FromStr for OutputSpec {
    type Err = String;

    fn from_str(text: &str) -> Result<OutputSpec, String> {
        if let Some(template) = text
            .strip_prefix("jsonpath=")
            .or_else(|| text.strip_prefix("jsonpath:"))
        {
            let template = template
                .parse::<JsonPath>()
                .map_err(|error| error.to_string())?;
            return Ok(OutputSpec {
                format: OutputFormat::JsonPath,
                template: Some(template),
                columns: None,
            });
        }
        if let Some(spec) = text.strip_prefix("custom-columns=") {
            return Ok(OutputSpec {
                format: OutputFormat::CustomColumns,
                template: None,
                columns: Some(parse_columns(spec)?),
            });
        }
        let format = OutputFormat::from_str(text, true).map_err(|_| {
            format!(
                "unknown output format {text:?}; use table, wide, yaml, json, name, \
                 jsonpath=TEMPLATE (e.g. -o jsonpath='{{.data.name}}') or \
                 custom-columns=NAME:PATH,… (e.g. -o custom-columns=NAME:.name,TEAM:.metadata.team)"
            )
        })?;
        Ok(OutputSpec {
            format,
            template: None,
            columns: None,
        })
    }
}

/// The template of `-o jsonpath=…`, set once from the command line: every command's JSON goes
/// through it.
static TEMPLATE: OnceLock<JsonPath> = OnceLock::new();

pub fn use_template(template: JsonPath) {
    // A second call (never made by the binary) keeps the first template.
    let _ = TEMPLATE.set(template);
}

/// The columns of `-o custom-columns=…`, set once from the command line.
static COLUMNS: OnceLock<Vec<Column>> = OnceLock::new();

pub fn use_columns(columns: Vec<Column>) {
    let _ = COLUMNS.set(columns);
}

/// A JSON value as the template renders it; a list is `{"items": [...]}`, as in kubectl.
fn templated(template: &JsonPath, value: serde_json::Value) -> String {
    match value {
        serde_json::Value::Array(items) => template.render(&serde_json::json!({ "items": items })),
        document => template.render(&document),
    }
}

/// A table with a header row; cells are padded to the widest in their column.
#[derive(Debug, Clone, Default)]
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new<I, S>(headers: I) -> Table
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Table {
            headers: headers.into_iter().map(Into::into).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row<I, S>(&mut self, cells: I)
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.rows.push(cells.into_iter().map(Into::into).collect());
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub fn render(&self) -> String {
        let columns = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (index, cell) in row.iter().enumerate().take(columns) {
                widths[index] = widths[index].max(cell.chars().count());
            }
        }
        let mut text = String::new();
        for row in std::iter::once(&self.headers).chain(&self.rows) {
            let mut line = String::new();
            for (index, cell) in row.iter().enumerate().take(columns) {
                if index + 1 == columns {
                    line.push_str(cell);
                } else {
                    line.push_str(cell);
                    let pad = widths[index] - cell.chars().count() + 3;
                    line.extend(std::iter::repeat_n(' ', pad));
                }
            }
            text.push_str(line.trim_end());
            text.push('\n');
        }
        text
    }
}

/// `text` without control characters (C0 but newline and tab, DEL, C1): what the cluster holds
/// was written by others (a report, a schema comment, a rule's message), and an escape sequence
/// in it must not move the operator's cursor, clear the terminal or forge a line.
pub fn clean(text: &str) -> std::borrow::Cow<'_, str> {
    let unwanted = |c: char| c.is_control() && c != '\n' && c != '\t';
    if text.contains(unwanted) {
        std::borrow::Cow::Owned(text.chars().filter(|c| !unwanted(*c)).collect())
    } else {
        std::borrow::Cow::Borrowed(text)
    }
}

/// Writes a line to stderr, [`clean`].
pub fn say_line(text: &str) {
    eprintln!("{}", clean(text));
}

/// Writes to stderr, [`clean`].
pub fn say_raw(text: &str) {
    eprint!("{}", clean(text));
}

/// `eprintln!`, [`clean`]ed: every line resctl writes to stderr goes through it.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::output::say_line(&format!($($arg)*))
    };
}

/// `eprint!`, [`clean`]ed.
#[macro_export]
macro_rules! say_raw {
    ($($arg:tt)*) => {
        $crate::output::say_raw(&format!($($arg)*))
    };
}

/// Writes to stdout, [`clean`]; a closed pipe (`resctl get … | head`) ends quietly.
pub fn print(text: &str) -> anyhow::Result<()> {
    let text = clean(text);
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|_| stdout.flush())
    {
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        other => Ok(other?),
    }
}

/// Pretty JSON, or what `-o jsonpath=…` makes of it.
pub fn json<T: Serialize + ?Sized>(value: &T) -> anyhow::Result<String> {
    if let Some(template) = TEMPLATE.get() {
        return Ok(templated(template, serde_json::to_value(value)?));
    }
    let mut text = serde_json::to_string_pretty(value)?;
    text.push('\n');
    Ok(text)
}

/// One line of NDJSON (watch), or what `-o jsonpath=…` makes of it.
pub fn json_line<T: Serialize + ?Sized>(value: &T) -> anyhow::Result<String> {
    if let Some(template) = TEMPLATE.get() {
        return Ok(templated(template, serde_json::to_value(value)?));
    }
    Ok(serde_json::to_string(value)? + "\n")
}

pub fn yaml<T: Serialize + ?Sized>(value: &T) -> anyhow::Result<String> {
    Ok(serde_yaml_ng::to_string(value)?)
}

/// `group.version.Kind/name`.
pub fn resource_name(resource: &Resource) -> String {
    let id = resource.id.clone().unwrap_or_default();
    format!(
        "{}/{}",
        id.r#type.as_ref().map(gvk).unwrap_or_default(),
        id.name
    )
}

/// The finalizers of a resource, comma-separated, with `(deleting)` when it is marked.
pub fn finalizers_label(resource: &Resource) -> String {
    let finalizers: Vec<&str> = proto::meta::finalizers(resource).into_iter().collect();
    let mut label = if finalizers.is_empty() {
        "-".to_owned()
    } else {
        finalizers.join(",")
    };
    if proto::meta::is_marked_for_deletion(resource) {
        label.push_str(" (deleting)");
    }
    label
}

fn condition_cell(resource: &Resource) -> String {
    // A deletion in progress says so first (kubectl's "Terminating"): the resource stays
    // until its finalizers are removed.
    if proto::meta::is_marked_for_deletion(resource) {
        return "Terminating".to_owned();
    }
    let mut cell = describe::worst_condition(resource)
        .map(describe::condition_label)
        .unwrap_or_else(|| "-".to_owned());
    if describe::is_stale(resource) {
        cell.push_str(" (stale)");
    }
    cell
}

fn owner_cell(resource: &Resource) -> String {
    resource
        .owner
        .as_ref()
        .map(describe::short_label)
        .unwrap_or_else(|| "-".to_owned())
}

/// Renders resources in any format. Lists are arrays in JSON and multi-document streams in
/// YAML; one resource (`single`) is a bare object or document.
pub fn render_resources(
    codec: &Codec,
    resources: &[Resource],
    format: OutputFormat,
    single: bool,
) -> anyhow::Result<String> {
    match format {
        OutputFormat::Json | OutputFormat::JsonPath => {
            let values = resources
                .iter()
                .map(|r| codec.to_value(r))
                .collect::<Result<Vec<_>, _>>()?;
            match (single, values.as_slice()) {
                (true, [value]) => json(value),
                _ => json(&values),
            }
        }
        OutputFormat::Yaml => {
            let mut text = String::new();
            for (index, resource) in resources.iter().enumerate() {
                if index > 0 {
                    text.push_str("---\n");
                }
                text.push_str(&codec.to_yaml(resource)?);
            }
            Ok(text)
        }
        OutputFormat::Name => Ok(resources.iter().map(|r| resource_name(r) + "\n").collect()),
        OutputFormat::CustomColumns => {
            let columns = COLUMNS.get().map(Vec::as_slice).unwrap_or_default();
            custom_columns(codec, resources, columns)
        }
        OutputFormat::Table | OutputFormat::Wide => {
            let wide = format == OutputFormat::Wide;
            let now = SystemTime::now();
            // The type's own columns (DESIGN §15.1), after NAME and TENANCY.
            let type_columns = type_columns(codec, resources);
            let mut headers: Vec<String> = vec!["NAME".into(), "TENANCY".into()];
            headers.extend(type_columns.iter().map(|(name, _, _)| name.to_uppercase()));
            headers.extend(
                ["VERSION", "AGE", "CONDITION", "OWNER"]
                    .into_iter()
                    .map(str::to_owned),
            );
            if wide {
                headers.extend(
                    ["GENERATION", "FINALIZERS", "UID", "TYPE"]
                        .into_iter()
                        .map(str::to_owned),
                );
            }
            let mut table = Table::new(headers);
            for resource in resources {
                let id = resource.id.clone().unwrap_or_default();
                let mut row = vec![
                    id.name.clone(),
                    describe::tenancy_label(id.tenancy.as_ref()),
                ];
                if !type_columns.is_empty() {
                    let document = codec.to_value(resource)?;
                    for (_, path, kind) in &type_columns {
                        row.push(column_cell(&path.render(&document), kind, now));
                    }
                }
                row.extend([
                    resource.version.clone(),
                    describe::age_of(resource, now),
                    condition_cell(resource),
                    owner_cell(resource),
                ]);
                if wide {
                    row.extend([
                        resource.generation.clone(),
                        finalizers_label(resource),
                        id.uid.clone(),
                        id.r#type.as_ref().map(gvk).unwrap_or_default(),
                    ]);
                }
                table.row(row);
            }
            Ok(table.render())
        }
    }
}

/// The columns a registered type declares (name, path, type), when every resource is of that
/// one type; paths that do not parse are left out.
fn type_columns(codec: &Codec, resources: &[Resource]) -> Vec<(String, JsonPath, String)> {
    let Some(first) = resources
        .first()
        .and_then(|r| r.id.as_ref())
        .and_then(|id| id.r#type.as_ref())
    else {
        return Vec::new();
    };
    let same = resources
        .iter()
        .all(|r| r.id.as_ref().and_then(|id| id.r#type.as_ref()) == Some(first));
    let Some(info) = codec.type_info(first).filter(|_| same) else {
        return Vec::new();
    };
    info.columns
        .iter()
        .filter_map(|column| {
            let path = column.json_path.parse().ok()?;
            Some((column.name.clone(), path, column.r#type.clone()))
        })
        .collect()
}

/// A type column's cell: `<none>` when the path selects nothing; a `date` as an age.
fn column_cell(value: &str, kind: &str, now: SystemTime) -> String {
    if value.is_empty() {
        return "<none>".to_owned();
    }
    if kind == "date"
        && let Ok(at) =
            time::OffsetDateTime::parse(value, &time::format_description::well_known::Rfc3339)
        && let Ok(age) = now.duration_since(SystemTime::from(at))
    {
        return describe::age_label(age);
    }
    value.to_owned()
}

/// A table of `columns` (a cell that selects nothing is `<none>`, as kubectl prints it).
pub fn custom_columns(
    codec: &Codec,
    resources: &[Resource],
    columns: &[Column],
) -> anyhow::Result<String> {
    let mut table = Table::new(columns.iter().map(|column| column.header.clone()));
    for resource in resources {
        let value = codec.to_value(resource)?;
        table.row(columns.iter().map(|column| {
            let cell = column.path.render(&value);
            if cell.is_empty() {
                "<none>".to_owned()
            } else {
                cell
            }
        }));
    }
    Ok(table.render())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn custom_columns_parse_as_kubectl_writes_them() {
        let columns = parse_columns("NAME:.name,team:{.metadata.team}").expect("columns");
        assert_eq!(columns.len(), 2);
        assert_eq!(columns[1].header, "TEAM");
        for bad in ["NAME", "NAME:", ":.name", "NAME:{.name"] {
            assert!(parse_columns(bad).is_err(), "{bad}");
        }
        let spec: OutputSpec = "custom-columns=N:.name".parse().expect("spec");
        assert_eq!(spec.format, OutputFormat::CustomColumns);
    }

    #[test]
    fn tables_align_columns_and_trim_the_last() {
        let mut table = Table::new(["NAME", "VERSION"]);
        table.row(["miles-davis", "12"]);
        table.row(["a", "3"]);
        assert_eq!(
            table.render(),
            "NAME          VERSION\nmiles-davis   12\na             3\n"
        );
    }

    #[test]
    fn a_resource_being_deleted_says_terminating() {
        let mut resource = Resource::default();
        assert_eq!(condition_cell(&resource), "-");
        resource
            .metadata
            .insert("deletionTimestamp".into(), "2026-11-26T00:00:00Z".into());
        assert_eq!(condition_cell(&resource), "Terminating");
    }
}

#[cfg(test)]
mod clean_tests {
    use super::clean;

    #[test]
    fn control_characters_are_dropped_but_lines_and_tabs_kept() {
        assert_eq!(clean("plain\ttext\n"), "plain\ttext\n");
        assert_eq!(clean("a\u{1b}[2Jb\rc\u{7f}d\u{9b}31me"), "a[2Jbcd31me");
        assert!(matches!(clean("no escapes"), std::borrow::Cow::Borrowed(_)));
    }
}
