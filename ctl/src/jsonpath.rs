//! `-o jsonpath=TEMPLATE`: kubectl's JSONPath subset over the JSON a command prints.
//!
//! A template is text with `{…}` expressions: paths (`{.data.name}`, `{.items[*].name}`,
//! `{.items[0]}`, `{.items[-1]}`, `{.items[1:3]}`, `{.metadata['a.b']}`, `{..name}`, `{@}`),
//! quoted literals (`{"\n"}`) and `{range PATH}…{end}`, which renders its body once per value
//! with that value as `@` (paths inside start from it). A template without braces is one path.
//! Several values of one expression are separated by a space; strings print bare, everything
//! else as compact JSON; a field that is not there prints nothing (as kubectl's default).

use std::fmt;
use std::str::FromStr;

use serde_json::Value;

/// A template that cannot be parsed, with where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("jsonpath {template:?}: {message} at character {position}")]
pub struct JsonPathError {
    template: String,
    message: String,
    position: usize,
}

/// A parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonPath {
    source: String,
    nodes: Vec<Node>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    Text(String),
    Path(Path),
    Range(Path, Vec<Node>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Path {
    /// `$…` starts from the document; everything else from `@`, the current value.
    from_root: bool,
    steps: Vec<Step>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    Field(String),
    /// `.*` and `[*]`: every element or member value.
    All,
    /// `..name`: the field at any depth.
    Descend(String),
    Index(i64),
    Slice(Option<i64>, Option<i64>),
}

impl fmt::Display for JsonPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

impl FromStr for JsonPath {
    type Err = JsonPathError;

    fn from_str(template: &str) -> Result<JsonPath, JsonPathError> {
        let wrapped;
        let text = if template.contains('{') {
            template
        } else {
            wrapped = format!("{{{template}}}");
            &wrapped
        };
        let mut parser = Parser {
            template,
            chars: text.char_indices().collect(),
            at: 0,
        };
        let (nodes, ended_by) = parser.nodes()?;
        if ended_by.is_some() {
            return Err(parser.error("{end} without a {range}"));
        }
        Ok(JsonPath {
            source: template.to_owned(),
            nodes,
        })
    }
}

impl JsonPath {
    /// Renders the template against a document.
    pub fn render(&self, document: &Value) -> String {
        let mut out = String::new();
        render_nodes(&self.nodes, document, document, &mut out);
        out
    }
}

fn render_nodes(nodes: &[Node], root: &Value, current: &Value, out: &mut String) {
    for node in nodes {
        match node {
            Node::Text(text) => out.push_str(text),
            Node::Path(path) => {
                let values = path.select(root, current);
                for (index, value) in values.iter().enumerate() {
                    if index > 0 {
                        out.push(' ');
                    }
                    push_value(value, out);
                }
            }
            Node::Range(path, body) => {
                for value in path.select(root, current) {
                    // `{range .items}` iterates the list itself, as `{range .items[*]}` does.
                    match value {
                        Value::Array(items) => {
                            for item in items {
                                render_nodes(body, root, item, out);
                            }
                        }
                        other => render_nodes(body, root, other, out),
                    }
                }
            }
        }
    }
}

fn push_value(value: &Value, out: &mut String) {
    match value {
        Value::String(text) => out.push_str(text),
        Value::Null => {}
        other => out.push_str(&other.to_string()),
    }
}

impl Path {
    fn select<'a>(&self, root: &'a Value, current: &'a Value) -> Vec<&'a Value> {
        let mut values = vec![if self.from_root { root } else { current }];
        for step in &self.steps {
            let mut next = Vec::new();
            for value in values {
                step.apply(value, &mut next);
            }
            values = next;
        }
        values
    }
}

impl Step {
    fn apply<'a>(&self, value: &'a Value, out: &mut Vec<&'a Value>) {
        match (self, value) {
            (Step::Field(name), Value::Object(map)) => out.extend(map.get(name)),
            (Step::All, Value::Array(items)) => out.extend(items),
            (Step::All, Value::Object(map)) => out.extend(map.values()),
            (Step::Descend(name), _) => descend(name, value, out),
            (Step::Index(index), Value::Array(items)) => {
                let at = if *index < 0 {
                    items.len().checked_sub(index.unsigned_abs() as usize)
                } else {
                    Some(*index as usize)
                };
                out.extend(at.and_then(|at| items.get(at)));
            }
            (Step::Slice(start, end), Value::Array(items)) => {
                let bound = |edge: i64| -> usize {
                    if edge < 0 {
                        items.len().saturating_sub(edge.unsigned_abs() as usize)
                    } else {
                        (edge as usize).min(items.len())
                    }
                };
                let from = start.map(bound).unwrap_or(0);
                let to = end.map(bound).unwrap_or(items.len());
                if from < to {
                    out.extend(&items[from..to]);
                }
            }
            _ => {}
        }
    }
}

fn descend<'a>(name: &str, value: &'a Value, out: &mut Vec<&'a Value>) {
    match value {
        Value::Object(map) => {
            out.extend(map.get(name));
            for child in map.values() {
                descend(name, child, out);
            }
        }
        Value::Array(items) => {
            for child in items {
                descend(name, child, out);
            }
        }
        _ => {}
    }
}

struct Parser<'t> {
    template: &'t str,
    chars: Vec<(usize, char)>,
    at: usize,
}

impl Parser<'_> {
    fn error(&self, message: impl Into<String>) -> JsonPathError {
        JsonPathError {
            template: self.template.to_owned(),
            message: message.into(),
            position: self.at + 1,
        }
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.at).map(|(_, c)| *c)
    }

    fn eat(&mut self, expected: char) -> bool {
        if self.peek() == Some(expected) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    fn skip_spaces(&mut self) {
        while self.peek().is_some_and(char::is_whitespace) {
            self.at += 1;
        }
    }

    /// Nodes up to the end of the template or an `{end}` (returned as `Some(())`).
    fn nodes(&mut self) -> Result<(Vec<Node>, Option<()>), JsonPathError> {
        let mut nodes = Vec::new();
        let mut text = String::new();
        while let Some(c) = self.peek() {
            if c != '{' {
                text.push(c);
                self.at += 1;
                continue;
            }
            if !text.is_empty() {
                nodes.push(Node::Text(std::mem::take(&mut text)));
            }
            self.at += 1;
            self.skip_spaces();
            if self.keyword("end") {
                self.close()?;
                return Ok((nodes, Some(())));
            }
            if self.keyword("range") {
                self.skip_spaces();
                let path = self.path()?;
                self.close()?;
                let (body, ended) = self.nodes()?;
                if ended.is_none() {
                    return Err(self.error("{range} without an {end}"));
                }
                nodes.push(Node::Range(path, body));
                continue;
            }
            if self.peek() == Some('"') {
                let literal = self.quoted('"')?;
                self.close()?;
                nodes.push(Node::Text(literal));
                continue;
            }
            let path = self.path()?;
            self.close()?;
            nodes.push(Node::Path(path));
        }
        if !text.is_empty() {
            nodes.push(Node::Text(text));
        }
        Ok((nodes, None))
    }

    /// Consumes `word` when it stands alone (followed by a space or `}`).
    fn keyword(&mut self, word: &str) -> bool {
        let ahead: String = self.chars[self.at..]
            .iter()
            .map(|(_, c)| *c)
            .take(word.len() + 1)
            .collect();
        let stands_alone = ahead
            .strip_prefix(word)
            .is_some_and(|after| matches!(after, "}" | " " | "\t"));
        if stands_alone {
            self.at += word.len();
        }
        stands_alone
    }

    fn close(&mut self) -> Result<(), JsonPathError> {
        self.skip_spaces();
        if self.eat('}') {
            Ok(())
        } else {
            Err(self.error("expected `}`"))
        }
    }

    fn path(&mut self) -> Result<Path, JsonPathError> {
        let mut path = Path {
            from_root: false,
            steps: Vec::new(),
        };
        if self.eat('$') {
            path.from_root = true;
        } else {
            self.eat('@');
        }
        loop {
            match self.peek() {
                Some('.') => {
                    self.at += 1;
                    if self.eat('.') {
                        let name = self.name()?;
                        path.steps.push(Step::Descend(name));
                    } else if self.eat('*') {
                        path.steps.push(Step::All);
                    } else if matches!(self.peek(), Some('}') | Some(' ') | None) {
                        // `{.}` is the current value.
                    } else {
                        let name = self.name()?;
                        path.steps.push(Step::Field(name));
                    }
                }
                Some('[') => {
                    self.at += 1;
                    path.steps.push(self.bracket()?);
                }
                Some('}') | Some(' ') | Some('\t') | None => return Ok(path),
                Some(_) if path.steps.is_empty() && !path.from_root => {
                    // `{name}`: a bare field of the current value.
                    let name = self.name()?;
                    path.steps.push(Step::Field(name));
                }
                Some(c) => return Err(self.error(format!("unexpected {c:?} in a path"))),
            }
        }
    }

    fn name(&mut self) -> Result<String, JsonPathError> {
        let mut name = String::new();
        while let Some(c) = self.peek() {
            if matches!(c, '.' | '[' | ']' | '{' | '}' | ' ' | '\t') {
                break;
            }
            name.push(c);
            self.at += 1;
        }
        if name.is_empty() {
            return Err(self.error("expected a field name"));
        }
        Ok(name)
    }

    fn bracket(&mut self) -> Result<Step, JsonPathError> {
        self.skip_spaces();
        let step = match self.peek() {
            Some('*') => {
                self.at += 1;
                Step::All
            }
            Some(quote @ ('\'' | '"')) => Step::Field(self.quoted(quote)?),
            Some('?') => return Err(self.error("filters `[?(…)]` are not supported")),
            _ => {
                let start = self.number()?;
                self.skip_spaces();
                if self.eat(':') {
                    self.skip_spaces();
                    let end = self.number()?;
                    Step::Slice(start, end)
                } else {
                    Step::Index(
                        start
                            .ok_or_else(|| self.error("expected an index, `*` or a quoted name"))?,
                    )
                }
            }
        };
        self.skip_spaces();
        if !self.eat(']') {
            return Err(self.error("expected `]`"));
        }
        Ok(step)
    }

    fn number(&mut self) -> Result<Option<i64>, JsonPathError> {
        let mut digits = String::new();
        if self.peek() == Some('-') {
            digits.push('-');
            self.at += 1;
        }
        while let Some(c) = self.peek().filter(char::is_ascii_digit) {
            digits.push(c);
            self.at += 1;
        }
        match digits.as_str() {
            "" => Ok(None),
            "-" => Err(self.error("expected digits after `-`")),
            _ => digits
                .parse()
                .map(Some)
                .map_err(|_| self.error(format!("index {digits} is out of range"))),
        }
    }

    /// A quoted string starting at the quote; `\n`, `\t`, `\\` and the quote are escapes.
    fn quoted(&mut self, quote: char) -> Result<String, JsonPathError> {
        self.at += 1;
        let mut text = String::new();
        loop {
            match self.peek() {
                None => return Err(self.error("unterminated quoted string")),
                Some(c) if c == quote => {
                    self.at += 1;
                    return Ok(text);
                }
                Some('\\') => {
                    self.at += 1;
                    let escaped = match self.peek() {
                        Some('n') => '\n',
                        Some('t') => '\t',
                        Some('r') => '\r',
                        Some(c) => c,
                        None => return Err(self.error("unterminated quoted string")),
                    };
                    text.push(escaped);
                    self.at += 1;
                }
                Some(c) => {
                    text.push(c);
                    self.at += 1;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn render(template: &str, document: &Value) -> String {
        template
            .parse::<JsonPath>()
            .unwrap_or_else(|error| panic!("{error}"))
            .render(document)
    }

    fn list() -> Value {
        json!({"items": [
            {"name": "miles-davis", "tenancy": {"namespace": "jazz"}, "data": {"genre": "JAZZ", "albums": 3}},
            {"name": "nina-simone", "tenancy": {"namespace": "soul"}, "data": {"genre": "SOUL"},
             "metadata": {"a.b": "dotted"}},
        ]})
    }

    #[test]
    fn fields_indexes_and_wildcards() {
        let document = list();
        assert_eq!(render("{.items[0].name}", &document), "miles-davis");
        assert_eq!(render("{.items[-1].name}", &document), "nina-simone");
        assert_eq!(
            render("{.items[*].name}", &document),
            "miles-davis nina-simone"
        );
        assert_eq!(
            render(".items[*].tenancy.namespace", &document),
            "jazz soul"
        );
        assert_eq!(render("{$.items[0:1].name}", &document), "miles-davis");
        assert_eq!(render("{.items[1].metadata['a.b']}", &document), "dotted");
        assert_eq!(render("{..genre}", &document), "JAZZ SOUL");
        assert_eq!(render("{.items[0].data.albums}", &document), "3");
        assert_eq!(
            render("{.items[0].data}", &document),
            r#"{"genre":"JAZZ","albums":3}"#
        );
    }

    #[test]
    fn missing_fields_print_nothing() {
        let document = list();
        assert_eq!(render("{.items[5].name}", &document), "");
        assert_eq!(render("x{.nope.deeper}y", &document), "xy");
    }

    #[test]
    fn range_renders_its_body_per_value_with_literals() {
        let document = list();
        assert_eq!(
            render(
                r#"{range .items[*]}{.name}{"\t"}{.data.genre}{"\n"}{end}"#,
                &document
            ),
            "miles-davis\tJAZZ\nnina-simone\tSOUL\n"
        );
        assert_eq!(
            render("{range .items}[{@.name}]{end}", &document),
            "[miles-davis][nina-simone]"
        );
    }

    #[test]
    fn bad_templates_say_what_and_where() {
        for (template, expected) in [
            ("{.items[0}", "expected `]`"),
            ("{range .items[*]}{.name}", "{range} without an {end}"),
            ("{end}", "{end} without a {range}"),
            ("{.items[?(@.name)]}", "filters `[?(…)]` are not supported"),
            ("{.items", "expected `}`"),
            ("{\"open}", "unterminated quoted string"),
        ] {
            let error = template
                .parse::<JsonPath>()
                .expect_err(template)
                .to_string();
            assert!(error.contains(expected), "{template}: {error}");
        }
    }
}
