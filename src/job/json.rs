//! A job message's JSON, read strictly: an object that names a key twice is refused, where
//! serde_json would keep the last value silently.
//!
//! Neighbours: `job::parse_job` reads every message body through it.

use serde_json::{Map, Value};

/// JSON text to a value, refusing an object that names a key twice: JSON leaves what that means
/// open and serde_json keeps the last, so `{"campaign":"a",…,"campaign":"b"}` would file the job
/// under whichever came last. Ambiguous input is refused, not guessed.
pub(super) fn parse_refusing_duplicate_keys(text: &str) -> Result<Value, serde_json::Error> {
    use serde::de::{Deserializer, Error, MapAccess, SeqAccess, Visitor};
    struct Checked(Value);
    struct CheckedVisitor;
    impl<'de> serde::Deserialize<'de> for Checked {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Checked, D::Error> {
            d.deserialize_any(CheckedVisitor).map(Checked)
        }
    }
    impl<'de> Visitor<'de> for CheckedVisitor {
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
            Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
        }
        fn visit_str<E>(self, v: &str) -> Result<Value, E> {
            Ok(Value::String(v.to_string()))
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
            let mut out = Vec::new();
            while let Some(Checked(v)) = seq.next_element()? {
                out.push(v);
            }
            Ok(Value::Array(out))
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
            let mut out = Map::new();
            while let Some(key) = map.next_key::<String>()? {
                if out.contains_key(&key) {
                    return Err(A::Error::custom(format!("the key `{}` appears twice in one object (ambiguous)", super::escape_controls(&key))));
                }
                let Checked(v) = map.next_value()?;
                out.insert(key, v);
            }
            Ok(Value::Object(out))
        }
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let Checked(v) = serde::Deserialize::deserialize(&mut de)?;
    de.end()?;
    Ok(v)
}
