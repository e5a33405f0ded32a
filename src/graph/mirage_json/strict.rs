//! JSON parsing that rejects an object with the same key twice (serde_json keeps the last one
//! silently; a µGraph whose `op_type` or `dim` appears twice is ambiguous) and stops at once
//! when the file holds more candidate graphs than allowed (each costs far more memory than the
//! two bytes of an empty `[]`). Produces the same `serde_json::Value` as
//! `serde_json::from_str`.

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use crate::graph::error::clip;

/// Where a value sits in the document, for the candidate count.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    /// The document: an array of candidates (if its first element is an array), a single
    /// graph, or a checkpoint object.
    Root,
    /// The `generated_graphs` array of a checkpoint object: every element is a candidate.
    Candidates,
    /// Anything else.
    Inner,
}

/// One value to parse, with its role and the candidate limit.
#[derive(Clone, Copy)]
struct StrictVisitor {
    role: Role,
    max_graphs: usize,
}

impl StrictVisitor {
    fn inner(self) -> Self {
        StrictVisitor {
            role: Role::Inner,
            ..self
        }
    }
}

impl<'de> DeserializeSeed<'de> for StrictVisitor {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut v = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        // The elements are candidates: all of `generated_graphs`, and those of the root array
        // when the first is an array (a single graph's elements are operator objects).
        let mut candidates = self.role == Role::Candidates;
        while let Some(x) = seq.next_element_seed(self.inner())? {
            if self.role == Role::Root && v.is_empty() {
                candidates = x.is_array();
            }
            if candidates && v.len() == self.max_graphs {
                return Err(de::Error::custom(format!(
                    "the file holds more than {} candidate graphs (--max-graphs raises the limit)",
                    self.max_graphs
                )));
            }
            v.push(x);
        }
        Ok(Value::Array(v))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut m = Map::new();
        while let Some(k) = map.next_key::<String>()? {
            if m.contains_key(&k) {
                return Err(de::Error::custom(format!(
                    "duplicate key `{}` in one object (which one counts is ambiguous)",
                    clip(&k)
                )));
            }
            let role = if self.role == Role::Root && k == "generated_graphs" {
                Role::Candidates
            } else {
                Role::Inner
            };
            let v = map.next_value_seed(StrictVisitor { role, ..self })?;
            m.insert(k, v);
        }
        Ok(Value::Object(m))
    }
}

/// Parses `text` as JSON, rejecting duplicate keys and more than `max_graphs` candidate graphs
/// (elements of a root array of arrays, or of a checkpoint's `generated_graphs`).
pub fn from_str(text: &str, max_graphs: usize) -> serde_json::Result<Value> {
    let mut d = serde_json::Deserializer::from_str(text);
    let v = StrictVisitor {
        role: Role::Root,
        max_graphs,
    }
    .deserialize(&mut d)?;
    d.end()?;
    Ok(v)
}

#[cfg(test)]
mod tests {
    #[test]
    fn duplicate_keys_are_errors_with_a_position() {
        let e = super::from_str("[{\"a\": 1,\n \"a\": 2}]", usize::MAX).unwrap_err();
        assert!(e.to_string().contains("duplicate key `a`"), "{e}");
        assert_eq!(e.line(), 2);
        let v = super::from_str(
            "{\"a\": [1, 2.5, \"x\", null, true], \"b\": {}}",
            usize::MAX,
        )
        .unwrap();
        assert_eq!(
            v,
            serde_json::from_str::<serde_json::Value>(&v.to_string()).unwrap()
        );
    }

    #[test]
    fn candidates_are_counted_while_parsing() {
        let list = "[[], [], [],\n []]";
        assert!(super::from_str(list, 4).is_ok());
        let e = super::from_str(list, 3).unwrap_err();
        assert!(
            e.to_string().contains("more than 3 candidate graphs"),
            "{e}"
        );
        assert_eq!(e.line(), 2);
        let checkpoint = "{\"generated_graphs\": [[], [], []], \"x\": [[], [], []]}";
        assert!(super::from_str(checkpoint, 3).is_ok());
        assert!(super::from_str(checkpoint, 2).is_err());
        // A single graph's operators and inner arrays are not candidates.
        let single = "[{\"dim\": [1, 2, 3]}, {}, {}, {}]";
        assert!(super::from_str(single, 1).is_ok());
        assert!(super::from_str("[[[1], [2], [3]]]", 1).is_ok());
    }
}
