//! A JSON value together with its path in the document, so that every read can fail with an
//! error naming exactly where.

use serde_json::Value;

use crate::graph::error::ErrorKind;

/// An error at a JSON path (the importer adds file and graph).
#[derive(Debug)]
pub struct PathErr {
    /// JSON path, e.g. `[0][3].bgraph.grid_dim.x`.
    pub path: String,
    /// What is wrong there.
    pub kind: ErrorKind,
    /// The operator concerned, when more precise than the importer's context.
    pub op: Option<String>,
}

/// Result of a read at a path.
pub type JResult<T> = Result<T, Box<PathErr>>;

/// A value and its path.
#[derive(Clone)]
pub struct J<'a> {
    /// The value.
    pub v: &'a Value,
    /// Its path.
    pub path: String,
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "an integer",
        Value::Number(_) => "a floating-point number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl<'a> J<'a> {
    /// The document root; `path` is the prefix shown for it (usually empty).
    pub fn root(v: &'a Value, path: impl Into<String>) -> Self {
        J {
            v,
            path: path.into(),
        }
    }

    /// An error at this value.
    pub fn err(&self, kind: ErrorKind) -> Box<PathErr> {
        Box::new(PathErr {
            path: self.path.clone(),
            kind,
            op: None,
        })
    }

    fn wrong(&self, expected: &'static str) -> Box<PathErr> {
        self.err(ErrorKind::WrongType {
            expected,
            found: type_name(self.v),
        })
    }

    fn child_key(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    /// The value of `key` (this value must be an object).
    pub fn key(&self, key: &str) -> JResult<J<'a>> {
        self.opt_key(key)?.ok_or_else(|| {
            Box::new(PathErr {
                path: self.child_key(key),
                kind: ErrorKind::MissingKey(key.to_string()),
                op: None,
            })
        })
    }

    /// The value of `key` if present (this value must be an object).
    pub fn opt_key(&self, key: &str) -> JResult<Option<J<'a>>> {
        let obj = self.v.as_object().ok_or_else(|| self.wrong("an object"))?;
        Ok(obj.get(key).map(|v| J {
            v,
            path: self.child_key(key),
        }))
    }

    /// Whether this value is an object with `key`.
    pub fn has(&self, key: &str) -> bool {
        self.v.as_object().is_some_and(|o| o.contains_key(key))
    }

    /// The elements (this value must be an array).
    pub fn items(&self) -> JResult<Vec<J<'a>>> {
        let arr = self.v.as_array().ok_or_else(|| self.wrong("an array"))?;
        Ok(arr
            .iter()
            .enumerate()
            .map(|(i, v)| J {
                v,
                path: format!("{}[{i}]", self.path),
            })
            .collect())
    }

    /// An integer.
    pub fn int(&self) -> JResult<i64> {
        if let Some(x) = self.v.as_i64() {
            return Ok(x);
        }
        if let Some(x) = self.v.as_u64() {
            return Err(self.err(ErrorKind::BadValue(format!(
                "integer {x} is out of range (at most {})",
                i64::MAX
            ))));
        }
        // Mirage's reader (nlohmann::json) converts numbers to integers: accept 64.0, but not
        // 64.5, which it would silently truncate.
        match self.v.as_f64() {
            Some(x) if x.fract() == 0.0 && x.abs() < 9.0e15 => Ok(x as i64),
            // Integers beyond 64 bits arrive as floating-point numbers.
            Some(x) if x.fract() == 0.0 => Err(self.err(ErrorKind::BadValue(format!(
                "integer {x:.4e} is out of range (at most {})",
                i64::MAX
            )))),
            _ => Err(self.wrong("an integer")),
        }
    }

    /// An integer in `lo..=hi`.
    pub fn int_in(&self, lo: i64, hi: i64, what: &str) -> JResult<i64> {
        let x = self.int()?;
        if x < lo || x > hi {
            return Err(self.err(ErrorKind::BadValue(format!(
                "{what} {x} is outside {lo}..={hi}"
            ))));
        }
        Ok(x)
    }

    /// A non-negative integer up to `hi`, as usize.
    pub fn size(&self, hi: usize, what: &str) -> JResult<usize> {
        Ok(self.int_in(0, hi as i64, what)? as usize)
    }

    /// A boolean.
    pub fn bool(&self) -> JResult<bool> {
        self.v.as_bool().ok_or_else(|| self.wrong("a boolean"))
    }

    /// A finite number.
    pub fn float(&self) -> JResult<f64> {
        match self.v.as_f64() {
            Some(x) if x.is_finite() => Ok(x),
            _ => Err(self.wrong("a number")),
        }
    }

    /// A number, or one of the strings `"inf"` and `"-inf"` (JSON has no infinities; mucc writes
    /// infinite clamp bounds so).
    pub fn extended_float(&self) -> JResult<f64> {
        match self.v.as_str() {
            Some("inf") => Ok(f64::INFINITY),
            Some("-inf") => Ok(f64::NEG_INFINITY),
            _ => self
                .float()
                .map_err(|_| self.wrong("a number, \"inf\" or \"-inf\"")),
        }
    }

    /// A string.
    pub fn str(&self) -> JResult<&'a str> {
        self.v.as_str().ok_or_else(|| self.wrong("a string"))
    }

    /// An `{"x":…, "y":…, "z":…}` object of integers.
    pub fn int3(&self) -> JResult<[i64; 3]> {
        Ok([
            self.key("x")?.int()?,
            self.key("y")?.int()?,
            self.key("z")?.int()?,
        ])
    }
}
