//! Selectors over a resource's metadata (DESIGN §3): Kubernetes' label-selector grammar —
//! `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k` (exists), `!k` (does not exist),
//! requirements joined by commas (and). The reserved keys (`finalizers`, `deletionTimestamp`)
//! are not labels and cannot be selected on.
//!
//! One grammar for everyone: the server evaluates selectors where the data is, resctl and the
//! dashboard parse them before sending (an error names the column at once).
//!
//! Semantics, as Kubernetes': `k!=v` and `k notin (…)` match a resource without `k`; `k=v` and
//! `k in (…)` need it. The empty selector matches everything.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::meta::{DELETION_TIMESTAMP_KEY, FINALIZERS_KEY};

/// Longest selector accepted, in bytes.
pub const MAX_SELECTOR_BYTES: usize = 4096;
/// Longest key (a DNS-subdomain prefix, `/`, and a name of at most 63).
const MAX_KEY_BYTES: usize = 253 + 1 + 63;
/// Longest value.
const MAX_VALUE_BYTES: usize = 63;

/// A parsed selector: every requirement must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    requirements: Vec<Requirement>,
}

/// One requirement on one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    pub key: String,
    pub operator: Operator,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operator {
    Equals(String),
    NotEquals(String),
    In(BTreeSet<String>),
    NotIn(BTreeSet<String>),
    Exists,
    DoesNotExist,
}

/// A selector that does not parse: where (a 1-based column) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("selector invalid at column {column}: {message}")]
pub struct SelectorError {
    pub column: usize,
    pub message: String,
}

impl Selector {
    /// Parses `text` (empty or only spaces: the selector that matches everything).
    pub fn parse(text: &str) -> Result<Selector, SelectorError> {
        if text.len() > MAX_SELECTOR_BYTES {
            return Err(SelectorError {
                column: MAX_SELECTOR_BYTES + 1,
                message: format!(
                    "a selector is at most {MAX_SELECTOR_BYTES} bytes, this one is {}",
                    text.len()
                ),
            });
        }
        Parser::new(text).selector()
    }

    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    /// Whether a resource with this metadata is selected.
    pub fn matches(&self, metadata: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|requirement| {
            let value = metadata.get(&requirement.key);
            match (&requirement.operator, value) {
                (Operator::Exists, found) => found.is_some(),
                (Operator::DoesNotExist, found) => found.is_none(),
                (Operator::Equals(wanted), Some(value)) => value == wanted,
                (Operator::In(wanted), Some(value)) => wanted.contains(value),
                (Operator::Equals(_) | Operator::In(_), None) => false,
                (Operator::NotEquals(unwanted), Some(value)) => value != unwanted,
                (Operator::NotIn(unwanted), Some(value)) => !unwanted.contains(value),
                (Operator::NotEquals(_) | Operator::NotIn(_), None) => true,
            }
        })
    }
}

impl std::str::FromStr for Selector {
    type Err = SelectorError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Selector::parse(text)
    }
}

/// The canonical text: requirements in the order given, no spaces but after `in`/`notin`.
impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (n, requirement) in self.requirements.iter().enumerate() {
            if n > 0 {
                f.write_str(",")?;
            }
            let key = &requirement.key;
            let set = |values: &BTreeSet<String>| {
                values
                    .iter()
                    .map(String::as_str)
                    .collect::<Vec<_>>()
                    .join(",")
            };
            match &requirement.operator {
                Operator::Equals(value) => write!(f, "{key}={value}")?,
                Operator::NotEquals(value) => write!(f, "{key}!={value}")?,
                Operator::In(values) => write!(f, "{key} in ({})", set(values))?,
                Operator::NotIn(values) => write!(f, "{key} notin ({})", set(values))?,
                Operator::Exists => write!(f, "{key}")?,
                Operator::DoesNotExist => write!(f, "!{key}")?,
            }
        }
        Ok(())
    }
}

/// What the lexer found, and where (a byte offset).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    /// Letters, digits and `-_./`.
    Word(String),
    Not,
    Equals,
    DoubleEquals,
    NotEquals,
    Comma,
    Open,
    Close,
    End,
}

impl Token {
    fn describe(&self) -> String {
        match self {
            Token::Word(word) => format!("{word:?}"),
            Token::Not => "\"!\"".into(),
            Token::Equals => "\"=\"".into(),
            Token::DoubleEquals => "\"==\"".into(),
            Token::NotEquals => "\"!=\"".into(),
            Token::Comma => "\",\"".into(),
            Token::Open => "\"(\"".into(),
            Token::Close => "\")\"".into(),
            Token::End => "the end".into(),
        }
    }
}

struct Parser<'a> {
    text: &'a str,
    /// Byte offset of the next unread character.
    at: usize,
    /// The next token and its offset, once peeked.
    peeked: Option<(Token, usize)>,
}

fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/')
}

impl<'a> Parser<'a> {
    fn new(text: &'a str) -> Self {
        Parser {
            text,
            at: 0,
            peeked: None,
        }
    }

    fn error(&self, offset: usize, message: String) -> SelectorError {
        SelectorError {
            column: self.text[..offset.min(self.text.len())].chars().count() + 1,
            message,
        }
    }

    fn lex(&mut self) -> Result<(Token, usize), SelectorError> {
        let rest = &self.text[self.at..];
        let trimmed = rest.trim_start();
        let start = self.at + (rest.len() - trimmed.len());
        let mut chars = trimmed.chars();
        let Some(first) = chars.next() else {
            self.at = start;
            return Ok((Token::End, start));
        };
        let (token, len) = match first {
            '!' if trimmed.starts_with("!=") => (Token::NotEquals, 2),
            '!' => (Token::Not, 1),
            '=' if trimmed.starts_with("==") => (Token::DoubleEquals, 2),
            '=' => (Token::Equals, 1),
            ',' => (Token::Comma, 1),
            '(' => (Token::Open, 1),
            ')' => (Token::Close, 1),
            c if is_word_char(c) => {
                let len = trimmed
                    .find(|c: char| !is_word_char(c))
                    .unwrap_or(trimmed.len());
                (Token::Word(trimmed[..len].to_owned()), len)
            }
            other => {
                return Err(self.error(
                    start,
                    format!(
                        "unexpected {other:?}: keys and values are letters, digits and -_./, and the operators are = == != in notin !"
                    ),
                ));
            }
        };
        self.at = start + len;
        Ok((token, start))
    }

    fn peek(&mut self) -> Result<(Token, usize), SelectorError> {
        if let Some(peeked) = &self.peeked {
            return Ok(peeked.clone());
        }
        let next = self.lex()?;
        self.peeked = Some(next.clone());
        Ok(next)
    }

    fn next(&mut self) -> Result<(Token, usize), SelectorError> {
        match self.peeked.take() {
            Some(token) => Ok(token),
            None => self.lex(),
        }
    }

    fn selector(mut self) -> Result<Selector, SelectorError> {
        let mut requirements = Vec::new();
        if self.peek()?.0 == Token::End {
            return Ok(Selector { requirements });
        }
        loop {
            requirements.push(self.requirement()?);
            match self.next()? {
                (Token::End, _) => return Ok(Selector { requirements }),
                (Token::Comma, _) => {}
                (token, at) => {
                    return Err(self.error(
                        at,
                        format!(
                            "expected \",\" or the end after a requirement, found {}",
                            token.describe()
                        ),
                    ));
                }
            }
        }
    }

    fn requirement(&mut self) -> Result<Requirement, SelectorError> {
        let (token, at) = self.next()?;
        if token == Token::Not {
            let key = self.key()?;
            return Ok(Requirement {
                key,
                operator: Operator::DoesNotExist,
            });
        }
        self.peeked = Some((token, at));
        let key = self.key()?;
        let (token, at) = self.peek()?;
        let operator = match token {
            Token::Comma | Token::End => Operator::Exists,
            Token::Equals | Token::DoubleEquals => {
                self.next()?;
                Operator::Equals(self.value()?)
            }
            Token::NotEquals => {
                self.next()?;
                Operator::NotEquals(self.value()?)
            }
            Token::Word(word) if word == "in" => {
                self.next()?;
                Operator::In(self.set()?)
            }
            Token::Word(word) if word == "notin" => {
                self.next()?;
                Operator::NotIn(self.set()?)
            }
            other => {
                return Err(self.error(
                    at,
                    format!(
                        "expected an operator (= == != in notin), \",\" or the end after key {key:?}, found {}",
                        other.describe()
                    ),
                ));
            }
        };
        Ok(Requirement { key, operator })
    }

    fn key(&mut self) -> Result<String, SelectorError> {
        let (token, at) = self.next()?;
        let Token::Word(key) = token else {
            return Err(self.error(at, format!("expected a key, found {}", token.describe())));
        };
        if key == FINALIZERS_KEY || key == DELETION_TIMESTAMP_KEY {
            return Err(self.error(
                at,
                format!(
                    "{key:?} is a reserved metadata key, not a label: selectors match the other keys"
                ),
            ));
        }
        if key.len() > MAX_KEY_BYTES {
            return Err(self.error(
                at,
                format!(
                    "a key is at most {MAX_KEY_BYTES} bytes, this one is {}",
                    key.len()
                ),
            ));
        }
        let name = key.rsplit('/').next().unwrap_or_default();
        let ok_ends = |s: &str| {
            s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
                && s.chars().last().is_some_and(|c| c.is_ascii_alphanumeric())
        };
        if key.matches('/').count() > 1
            || !ok_ends(name)
            || (key.contains('/') && !ok_ends(&key[..key.len() - name.len() - 1]))
        {
            return Err(self.error(
                at,
                format!(
                    "invalid key {key:?}: a key is [prefix/]name, each beginning and ending with a letter or digit"
                ),
            ));
        }
        Ok(key)
    }

    fn value(&mut self) -> Result<String, SelectorError> {
        let (token, at) = self.peek()?;
        match token {
            // `k=` selects the empty value.
            Token::Comma | Token::End | Token::Close => Ok(String::new()),
            Token::Word(value) => {
                self.next()?;
                if value.len() > MAX_VALUE_BYTES {
                    return Err(self.error(
                        at,
                        format!(
                            "a value is at most {MAX_VALUE_BYTES} bytes, this one is {}",
                            value.len()
                        ),
                    ));
                }
                if value.contains('/') {
                    return Err(
                        self.error(at, format!("invalid value {value:?}: \"/\" is for keys"))
                    );
                }
                Ok(value)
            }
            other => Err(self.error(at, format!("expected a value, found {}", other.describe()))),
        }
    }

    fn set(&mut self) -> Result<BTreeSet<String>, SelectorError> {
        let (token, at) = self.next()?;
        if token != Token::Open {
            return Err(self.error(
                at,
                format!(
                    "expected \"(\" to open the set of values, found {}",
                    token.describe()
                ),
            ));
        }
        let mut values = BTreeSet::new();
        loop {
            let (_, at) = self.peek()?;
            let value = self.value()?;
            if value.is_empty() && !matches!(self.peek()?.0, Token::Comma | Token::Close) {
                return Err(self.error(at, "expected a value".into()));
            }
            values.insert(value);
            match self.next()? {
                (Token::Comma, _) => {}
                (Token::Close, _) => break,
                (token, at) => {
                    return Err(self.error(
                        at,
                        format!(
                            "expected \",\" or \")\" in the set, found {}",
                            token.describe()
                        ),
                    ));
                }
            }
        }
        if values.len() == 1 && values.contains("") {
            return Err(self.error(at, "the set of values is empty".into()));
        }
        Ok(values)
    }
}

#[cfg(test)]
mod tests;
