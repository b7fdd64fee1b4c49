//! Secret values in zeroizing memory.
//!
//! Every value read from the server is deserialized straight into a
//! [`SecretString`] (zeroed when dropped), never into a `serde_json::Value`
//! or a plain `String` that would outlive its use. What the HTTP stack
//! buffered on its way in is outside our control (see docs/creds.md).

use std::collections::BTreeMap;
use std::fmt;

use secrecy::SecretString;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use zeroize::Zeroize;

/// One secret value: a string, or the text of a number, boolean or JSON
/// object/array (compact JSON) when the secret holds one.
pub struct SecretText(pub SecretString);

impl fmt::Debug for SecretText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretText([REDACTED])")
    }
}

impl<'de> serde::Deserialize<'de> for SecretText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(TextVisitor)
    }
}

struct TextVisitor;

fn text(s: String) -> SecretText {
    SecretText(SecretString::from(s))
}

impl<'de> Visitor<'de> for TextVisitor {
    type Value = SecretText;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a secret value")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<SecretText, E> {
        Ok(text(v.to_owned()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<SecretText, E> {
        Ok(text(v))
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<SecretText, E> {
        Ok(text(v.to_string()))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<SecretText, E> {
        Ok(text(v.to_string()))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<SecretText, E> {
        Ok(text(v.to_string()))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<SecretText, E> {
        Ok(text(v.to_string()))
    }
    fn visit_unit<E: de::Error>(self) -> Result<SecretText, E> {
        Ok(text(String::new()))
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<SecretText, A::Error> {
        let v: serde_json::Value =
            serde::Deserialize::deserialize(de::value::MapAccessDeserializer::new(map))?;
        Ok(compact(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<SecretText, A::Error> {
        let v: serde_json::Value =
            serde::Deserialize::deserialize(de::value::SeqAccessDeserializer::new(seq))?;
        Ok(compact(v))
    }
}

fn compact(mut v: serde_json::Value) -> SecretText {
    let s = v.to_string();
    scrub(&mut v);
    text(s)
}

/// Zeroes the strings of a JSON value before it is dropped.
pub fn scrub(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::String(s) => s.zeroize(),
        serde_json::Value::Array(a) => a.iter_mut().for_each(scrub),
        serde_json::Value::Object(o) => {
            o.values_mut().for_each(scrub);
        }
        _ => {}
    }
}

/// The key/value map of a secret, values zeroizing.
#[derive(Default)]
pub struct SecretMap(pub BTreeMap<String, SecretText>);

impl fmt::Debug for SecretMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.0.keys()).finish()
    }
}

impl<'de> serde::Deserialize<'de> for SecretMap {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = SecretMap;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object of secret values")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<SecretMap, A::Error> {
                let mut out = BTreeMap::new();
                while let Some((k, v)) = map.next_entry::<String, SecretText>()? {
                    out.insert(k, v);
                }
                Ok(SecretMap(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// Zeroes a serde error message before it could reach a log: serde quotes
/// the offending value ("invalid type: string \"hunter2\""), so errors from
/// decoding a server answer are reported by their position only.
pub fn describe_decode_error(e: &serde_json::Error) -> String {
    format!(
        "{} at line {} column {}",
        match e.classify() {
            serde_json::error::Category::Io => "read error",
            serde_json::error::Category::Syntax => "not valid JSON",
            serde_json::error::Category::Data => "unexpected structure",
            serde_json::error::Category::Eof => "truncated",
        },
        e.line(),
        e.column()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use secrecy::ExposeSecret;

    #[test]
    fn values_of_any_json_type() {
        let m: SecretMap =
            serde_json::from_str(r#"{"a":"s3cr3tval","n":3,"b":true,"o":{"k":[1,"z"]},"u":null}"#)
                .unwrap();
        let get = |k: &str| m.0[k].0.expose_secret().to_string();
        assert_eq!(get("a"), "s3cr3tval");
        assert_eq!(get("n"), "3");
        assert_eq!(get("b"), "true");
        assert_eq!(get("o"), r#"{"k":[1,"z"]}"#);
        assert_eq!(get("u"), "");
        assert!(!format!("{m:?}").contains("s3cr3tval"));
        assert!(!format!("{:?}", m.0["a"]).contains("s3cr3tval"));
    }

    #[test]
    fn decode_errors_never_quote_values() {
        let e = serde_json::from_str::<SecretMap>(r#""hunter2""#).unwrap_err();
        assert!(e.to_string().contains("hunter2"), "serde does quote: {e}");
        assert!(!describe_decode_error(&e).contains("hunter2"));
    }
}
