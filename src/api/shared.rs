//! Small types and schema helpers that more than one part of the API uses.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A key of a ConfigMap or Secret in the same namespace.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeyRef {
    /// The object's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The key inside it.
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// The API server knows the OpenAPI formats `int32` and `int64`, not schemars' `uint32`
/// (`kubectl apply` warns `unrecognized format "uint32"`): an unsigned field keeps its type and
/// its `minimum`/`maximum`, which do the validating, without the format.
pub(super) fn no_unsigned_format(schema: &mut schemars::Schema) {
    if schema
        .get("format")
        .and_then(|f| f.as_str())
        .is_some_and(|f| f.starts_with("uint"))
    {
        schema.remove("format");
    }
}
