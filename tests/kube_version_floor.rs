//! The Kubernetes version floor (`kubeVersion` in charts/dbop/Chart.yaml, the same number in
//! docs/install.md) is at least the newest version that any CRD validation feature we use needs.
//!
//! Older API servers refuse the CRDs (an unknown CEL function is a compile error when the CRD is
//! created) or silently drop fields they do not know (`fieldPath`, `reason`). The check is static:
//! every function, macro, syntax and rule field in the generated CRDs is looked up in a table of
//! the Kubernetes version whose API server first accepts it in a *new* CRD rule. A name that is not
//! in the table fails the test until someone adds it with its version.
//!
//! `the_floor_releases_crd_validation_accepts_the_crds` then runs the floor release's own CRD
//! validation on them (e2e/testbed/crd-floor.sh), which catches what a table cannot (a field
//! named with a reserved word, the cost budget).
//!
//! Where the versions come from: apiextensions-apiserver's `ValidationRule` type of each release
//! (the fields), and apiserver's `pkg/cel/environment/base.go` (the CEL libraries, each with the
//! `IntroducedVersion` of its environment). Since 1.28 an API server compiles new expressions
//! against its *previous* minor's environment (`DefaultCompatibilityVersion` = N-1, so that a
//! rollback by one minor still understands every stored rule): a library introduced at 1.28 can
//! be used in a new CRD from 1.29 on. The table below holds the resulting first usable version.

use std::collections::BTreeMap;

type Version = (u32, u32);

/// CEL validation rules in CRDs: beta and on by default since 1.25 (alpha 1.23), GA 1.29.
const RULES: Version = (1, 25);

/// Functions and macros by name (a method or a global; `ns.name` for namespaced ones, `ns.*` for
/// a whole namespace) -> (first Kubernetes version accepting it in a new CRD rule, where it is from).
/// A name two libraries share counts at its older one (the static check cannot see types).
const FUNCTIONS: &[(&str, Version, &str)] = &[
    // The CEL language (standard definitions and macros), in CRDs since validation rules.
    ("has", RULES, "CEL macro"),
    ("all", RULES, "CEL macro"),
    ("exists", RULES, "CEL macro"),
    ("exists_one", RULES, "CEL macro"),
    ("map", RULES, "CEL macro"),
    ("filter", RULES, "CEL macro"),
    ("size", RULES, "CEL standard"),
    ("int", RULES, "CEL standard"),
    ("uint", RULES, "CEL standard"),
    ("double", RULES, "CEL standard"),
    ("string", RULES, "CEL standard"),
    ("bytes", RULES, "CEL standard"),
    ("bool", RULES, "CEL standard"),
    ("type", RULES, "CEL standard"),
    ("dyn", RULES, "CEL standard"),
    ("duration", RULES, "CEL standard"),
    ("timestamp", RULES, "CEL standard"),
    ("matches", RULES, "CEL standard (RE2)"),
    ("startsWith", RULES, "CEL standard"),
    ("endsWith", RULES, "CEL standard"),
    ("contains", RULES, "CEL standard"),
    ("getFullYear", RULES, "CEL standard"),
    ("getMonth", RULES, "CEL standard"),
    ("getDayOfMonth", RULES, "CEL standard"),
    ("getDayOfWeek", RULES, "CEL standard"),
    ("getDayOfYear", RULES, "CEL standard"),
    ("getHours", RULES, "CEL standard"),
    ("getMinutes", RULES, "CEL standard"),
    ("getSeconds", RULES, "CEL standard"),
    ("getMilliseconds", RULES, "CEL standard"),
    // cel-go's strings extension, version 0 (`ext.Strings()` in 1.25's ExtensionLibs).
    ("charAt", RULES, "strings extension v0"),
    ("indexOf", RULES, "strings extension v0"),
    ("lastIndexOf", RULES, "strings extension v0"),
    ("lowerAscii", RULES, "strings extension v0"),
    ("upperAscii", RULES, "strings extension v0"),
    ("replace", RULES, "strings extension v0"),
    ("split", RULES, "strings extension v0"),
    ("substring", RULES, "strings extension v0"),
    ("trim", RULES, "strings extension v0"),
    ("join", RULES, "strings extension v0"),
    // Kubernetes' own libraries of 1.25 (lists, regex, URLs).
    ("isSorted", RULES, "Kubernetes lists library"),
    ("sum", RULES, "Kubernetes lists library"),
    ("min", RULES, "Kubernetes lists library"),
    ("max", RULES, "Kubernetes lists library"),
    ("find", RULES, "Kubernetes regex library"),
    ("findAll", RULES, "Kubernetes regex library"),
    ("url", RULES, "Kubernetes URL library"),
    ("isURL", RULES, "Kubernetes URL library"),
    ("getScheme", RULES, "Kubernetes URL library"),
    ("getHost", RULES, "Kubernetes URL library"),
    ("getHostname", RULES, "Kubernetes URL library"),
    ("getPort", RULES, "Kubernetes URL library"),
    ("getEscapedPath", RULES, "Kubernetes URL library"),
    ("getQuery", RULES, "Kubernetes URL library"),
    // Introduced at 1.28 (quantity library, optional types): usable in new rules from 1.29.
    ("quantity", (1, 29), "Kubernetes quantity library"),
    ("isQuantity", (1, 29), "Kubernetes quantity library"),
    ("sign", (1, 29), "Kubernetes quantity library"),
    ("isGreaterThan", (1, 29), "Kubernetes quantity library"),
    ("isLessThan", (1, 29), "Kubernetes quantity library"),
    ("compareTo", (1, 29), "Kubernetes quantity library"),
    ("asApproximateFloat", (1, 29), "Kubernetes quantity library"),
    ("asInteger", (1, 29), "Kubernetes quantity library"),
    ("isInteger", (1, 29), "Kubernetes quantity library"),
    ("add", (1, 29), "Kubernetes quantity library"),
    ("sub", (1, 29), "Kubernetes quantity library"),
    ("optional.*", (1, 29), "CEL optional types"),
    ("hasValue", (1, 29), "CEL optional types"),
    ("value", (1, 29), "CEL optional types"),
    ("orValue", (1, 29), "CEL optional types"),
    ("or", (1, 29), "CEL optional types"),
    // Introduced at 1.29 (strings extension v2, sets): from 1.30.
    ("format", (1, 30), "strings extension v2"),
    ("strings.quote", (1, 30), "strings extension v2"),
    ("sets.*", (1, 30), "sets extension"),
    // Introduced at 1.30 (IP and CIDR libraries): from 1.31.
    ("ip", (1, 31), "Kubernetes IP library"),
    ("isIP", (1, 31), "Kubernetes IP library"),
    ("ip.isCanonical", (1, 31), "Kubernetes IP library"),
    ("family", (1, 31), "Kubernetes IP library"),
    ("isUnspecified", (1, 31), "Kubernetes IP library"),
    ("isLoopback", (1, 31), "Kubernetes IP library"),
    ("isLinkLocalMulticast", (1, 31), "Kubernetes IP library"),
    ("isLinkLocalUnicast", (1, 31), "Kubernetes IP library"),
    ("isGlobalUnicast", (1, 31), "Kubernetes IP library"),
    ("cidr", (1, 31), "Kubernetes CIDR library"),
    ("isCIDR", (1, 31), "Kubernetes CIDR library"),
    ("containsIP", (1, 31), "Kubernetes CIDR library"),
    ("containsCIDR", (1, 31), "Kubernetes CIDR library"),
    ("prefixLength", (1, 31), "Kubernetes CIDR library"),
    ("masked", (1, 31), "Kubernetes CIDR library"),
    // Introduced at 1.31 (format library: format.dns1123Label().validate(…)): from 1.32.
    ("format.*", (1, 32), "Kubernetes format library"),
    ("validate", (1, 32), "Kubernetes format library"),
    // Introduced at 1.32 (two-variable comprehensions): from 1.33.
    ("transformList", (1, 33), "two-variable comprehensions"),
    ("transformMap", (1, 33), "two-variable comprehensions"),
    ("transformMapEntry", (1, 33), "two-variable comprehensions"),
    // Introduced at 1.33 (semver library): from 1.34.
    ("semver", (1, 34), "Kubernetes semver library"),
    ("isSemver", (1, 34), "Kubernetes semver library"),
    ("major", (1, 34), "Kubernetes semver library"),
    ("minor", (1, 34), "Kubernetes semver library"),
    ("patch", (1, 34), "Kubernetes semver library"),
    // Introduced at 1.34 (lists extension v3): from 1.35.
    ("lists.*", (1, 35), "lists extension v3"),
    ("slice", (1, 35), "lists extension v3"),
    ("flatten", (1, 35), "lists extension v3"),
    ("distinct", (1, 35), "lists extension v3"),
    ("reverse", (1, 35), "lists extension v3"),
    ("sort", (1, 35), "lists extension v3"),
    ("sortBy", (1, 35), "lists extension v3"),
    ("first", (1, 35), "lists extension v3"),
    ("last", (1, 35), "lists extension v3"),
];

/// Namespaces that qualify a global function (`sets.contains(…)`), as opposed to a field.
const NAMESPACES: &[&str] = &["optional", "strings", "sets", "format", "lists", "ip"];

/// CEL's reserved words (cel-spec langdef). A property so named is selected escaped,
/// `self.__namespace__`, on every version; unescaped (`self.namespace`) only where the API server
/// compiles new rules at compatibility version 1.31 (apiserver's `SetRecognizeKeywordAsFieldName`),
/// i.e. from 1.32.
const RESERVED: &[&str] = &[
    "as",
    "break",
    "const",
    "continue",
    "else",
    "for",
    "function",
    "if",
    "import",
    "let",
    "loop",
    "package",
    "namespace",
    "return",
    "var",
    "void",
    "while",
];

/// The fields of a rule (`x-kubernetes-validations` entries) -> first version that keeps them.
const RULE_FIELDS: &[(&str, Version, &str)] = &[
    ("rule", RULES, "validation rules"),
    ("message", RULES, "validation rules"),
    (
        "messageExpression",
        (1, 27),
        "ValidationRule.messageExpression",
    ),
    ("reason", (1, 28), "ValidationRule.reason"),
    ("fieldPath", (1, 28), "ValidationRule.fieldPath"),
    // CRDValidationRatcheting: alpha 1.28 (off), beta and on by default 1.30, GA 1.33.
    (
        "optionalOldSelf",
        (1, 30),
        "ValidationRule.optionalOldSelf (CRDValidationRatcheting)",
    ),
];

/// One use of a feature: what, the version it needs, where in which CRD.
#[derive(Debug, Clone, PartialEq)]
struct Need {
    feature: String,
    since: Version,
    origin: &'static str,
    at: String,
}

/// The rule text with every string literal replaced by `""` (so that a regex such as
/// `'^[a-z]([-a-z0-9]*)'` is not read as calls).
fn without_strings(rule: &str) -> String {
    let chars: Vec<char> = rule.chars().collect();
    let (mut out, mut i) = (String::new(), 0);
    while i < chars.len() {
        let c = chars[i];
        if c != '\'' && c != '"' {
            out.push(c);
            i += 1;
            continue;
        }
        let raw = i > 0 && matches!(chars[i - 1], 'r' | 'R');
        let triple = chars.get(i + 1) == Some(&c) && chars.get(i + 2) == Some(&c);
        let close = if triple { 3 } else { 1 };
        i += close;
        while i < chars.len() {
            if !raw && chars[i] == '\\' {
                i += 2;
            } else if chars[i..].iter().take(close).all(|&d| d == c) && i + close <= chars.len() {
                i += close;
                break;
            } else {
                i += 1;
            }
        }
        out.push_str("\"\"");
    }
    out
}

/// How many top-level arguments the call whose `(` is at `open` has.
fn argument_count(chars: &[char], open: usize) -> usize {
    let (mut depth, mut commas, mut empty) = (0usize, 0usize, true);
    for &c in &chars[open + 1..] {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' if depth == 0 => break,
            ')' | ']' | '}' => depth -= 1,
            ',' if depth == 0 => commas += 1,
            _ => {}
        }
        if !c.is_whitespace() {
            empty = false;
        }
    }
    if empty { 0 } else { commas + 1 }
}

/// Every call in a rule, as the table names it: `name`, or `ns.name` after a namespace (a
/// three-argument `all`/`exists`/`exists_one` is `two-variable all`…); plus `optional syntax`
/// for `.?`/`[?`, `oldSelf` for a transition rule and `reserved word field NAME` for a
/// selection such as `self.namespace`.
fn calls(rule: &str) -> Vec<String> {
    let chars: Vec<char> = without_strings(rule).chars().collect();
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut found = vec![];
    let mut i = 0;
    while i < chars.len() {
        if !(chars[i].is_ascii_alphabetic() || chars[i] == '_') || (i > 0 && ident(chars[i - 1])) {
            if (chars[i] == '.' || chars[i] == '[') && chars.get(i + 1) == Some(&'?') {
                found.push("optional syntax".to_string());
            }
            i += 1;
            continue;
        }
        let start = i;
        while i < chars.len() && ident(chars[i]) {
            i += 1;
        }
        let name: String = chars[start..i].iter().collect();
        if name == "oldSelf" {
            found.push(name.clone());
        }
        let selected = start > 0 && chars[start - 1] == '.';
        if selected && RESERVED.contains(&name.as_str()) && chars.get(i) != Some(&'(') {
            found.push(format!("reserved word field {name}"));
        }
        let mut j = i;
        while j < chars.len() && chars[j].is_whitespace() {
            j += 1;
        }
        if chars.get(j) != Some(&'(') {
            continue;
        }
        let namespace = namespace_before(&chars, start);
        let args = argument_count(&chars, j);
        found.push(match namespace {
            Some(ns) => format!("{ns}.{name}"),
            None if matches!(name.as_str(), "all" | "exists" | "exists_one") && args == 3 => {
                format!("two-variable {name}")
            }
            None => name,
        });
    }
    found
}

/// The namespace before the identifier at `start` (`sets` in `sets.contains`), when the word
/// before the dot is one and is not itself a field (`self.sets.contains` is a method call).
fn namespace_before(chars: &[char], start: usize) -> Option<String> {
    if start < 2 || chars[start - 1] != '.' {
        return None;
    }
    let end = start - 1;
    let mut begin = end;
    while begin > 0 && (chars[begin - 1].is_ascii_alphanumeric() || chars[begin - 1] == '_') {
        begin -= 1;
    }
    let word: String = chars[begin..end].iter().collect();
    let is_field = begin > 0 && chars[begin - 1] == '.';
    (NAMESPACES.contains(&word.as_str()) && !is_field).then_some(word)
}

/// The table entry of a call, or None when it is not in the table.
fn function_version(call: &str) -> Option<(Version, &'static str)> {
    let special = match call {
        "oldSelf" => Some((RULES, "transition rule")),
        "optional syntax" => Some(((1, 29), "CEL optional types")),
        c if c.starts_with("two-variable ") => Some(((1, 33), "two-variable comprehensions")),
        c if c.starts_with("reserved word field ") => Some((
            (1, 32),
            "a field named with a CEL reserved word, unescaped (`__name__` works from 1.25)",
        )),
        _ => None,
    };
    special.or_else(|| {
        let wildcard = call.split_once('.').map(|(ns, _)| format!("{ns}.*"));
        FUNCTIONS
            .iter()
            .find(|(name, ..)| *name == call || Some(name.to_string()) == wildcard)
            .map(|&(_, since, origin)| (since, origin))
    })
}

/// What one validation rule needs; Err names what the table does not know.
fn rule_needs(rule: &serde_json::Value, at: &str) -> Result<Vec<Need>, String> {
    let mut needs = vec![];
    let fields = rule
        .as_object()
        .ok_or(format!("{at}: a rule that is not an object"))?;
    for field in fields.keys() {
        let &(_, since, origin) = RULE_FIELDS
            .iter()
            .find(|(name, ..)| name == field)
            .ok_or(format!("{at}: rule field {field} is not in RULE_FIELDS"))?;
        needs.push(Need {
            feature: field.clone(),
            since,
            origin,
            at: at.to_string(),
        });
    }
    let texts = ["rule", "messageExpression"].map(|k| rule[k].as_str().unwrap_or(""));
    for call in texts.iter().flat_map(|t| calls(t)) {
        let (since, origin) = function_version(&call).ok_or(format!(
            "{at}: `{call}` is not in FUNCTIONS: add it with the Kubernetes version that first \
             accepts it in a new CRD rule (apiserver's pkg/cel/environment/base.go, + 1 minor)"
        ))?;
        needs.push(Need {
            feature: call,
            since,
            origin,
            at: at.to_string(),
        });
    }
    Ok(needs)
}

/// Every rule of a CRD (as JSON) with its schema path.
fn rules_of(value: &serde_json::Value, at: &str, out: &mut Vec<(String, serde_json::Value)>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, child) in map {
                if key == "x-kubernetes-validations" {
                    for rule in child.as_array().into_iter().flatten() {
                        out.push((at.to_string(), rule.clone()));
                    }
                } else {
                    rules_of(child, &format!("{at}/{key}"), out);
                }
            }
        }
        serde_json::Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                rules_of(item, &format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}

/// What the given CRDs need, the newest need of each feature first.
fn needs_of(crds: &[serde_json::Value]) -> Result<Vec<Need>, String> {
    let mut needs = vec![];
    for crd in crds {
        let mut rules = vec![];
        rules_of(
            crd,
            crd["metadata"]["name"].as_str().unwrap_or("?"),
            &mut rules,
        );
        for (at, rule) in &rules {
            needs.extend(rule_needs(rule, at)?);
        }
    }
    needs.sort_by_key(|n| std::cmp::Reverse(n.since));
    Ok(needs)
}

fn generated_crds() -> Vec<serde_json::Value> {
    dbop::api::crds()
        .iter()
        .map(|c| serde_json::to_value(c).unwrap())
        .collect()
}

/// "1.29" of a `kubeVersion: ">=1.29.0-0"`.
fn parse_floor(kube_version: &str) -> Option<Version> {
    let v = kube_version
        .trim()
        .strip_prefix(">=")?
        .trim()
        .trim_start_matches('v');
    let mut parts = v.split(['.', '-']);
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

fn chart_floor() -> Version {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/charts/dbop/Chart.yaml");
    let chart: serde_json::Value =
        serde_norway::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let kube_version = chart["kubeVersion"]
        .as_str()
        .expect("Chart.yaml has a kubeVersion");
    parse_floor(kube_version)
        .unwrap_or_else(|| panic!("kubeVersion {kube_version:?} is not of the form >=1.N.0-0"))
}

#[test]
fn every_crd_rule_runs_on_the_charts_kubernetes_floor() {
    let floor = chart_floor();
    let needs = needs_of(&generated_crds()).unwrap_or_else(|e| panic!("{e}"));
    let too_new: Vec<&Need> = needs.iter().filter(|n| n.since > floor).collect();
    assert!(
        too_new.is_empty(),
        "CRD rules need a newer Kubernetes than the chart's floor {}.{}: {too_new:#?}\n\
         raise kubeVersion in charts/dbop/Chart.yaml and docs/install.md, or rewrite the rule",
        floor.0,
        floor.1
    );
}

/// The floor release's own CRD validation (e2e/testbed/crd-floor.sh: apiextensions-apiserver
/// pinned at the chart's floor, needs Go; built once and cached) accepts the generated CRDs.
#[test]
fn the_floor_releases_crd_validation_accepts_the_crds() {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = std::process::Command::new(format!("{root}/e2e/testbed/crd-floor.sh"))
        .arg(format!("{root}/crds/dbop.dev.yaml"))
        .output()
        .expect("running e2e/testbed/crd-floor.sh (needs bash and Go, as the test bed)");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success() && stdout.contains("2 CRDs checked"),
        "the floor release refuses the CRDs (or crd-floor.sh failed):\n{stdout}\n{stderr}"
    );
}

#[test]
fn the_docs_state_the_charts_floor() {
    let (major, minor) = chart_floor();
    let install =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/install.md")).unwrap();
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let claim = format!("Kubernetes {major}.{minor} or newer");
    assert!(
        install.contains(&claim),
        "docs/install.md does not say {claim:?}"
    );
    assert!(readme.contains(&claim), "README.md does not say {claim:?}");
}

#[test]
fn a_rule_newer_than_the_floor_is_seen() {
    let crd = |rule: &str, extra: serde_json::Value| {
        let mut r = serde_json::json!({"rule": rule, "message": "m"});
        r.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        serde_json::json!({"metadata": {"name": "t"}, "spec": {"x-kubernetes-validations": [r]}})
    };
    let newest = |c: serde_json::Value| needs_of(&[c]).unwrap()[0].clone();
    let none = serde_json::json!({});
    assert_eq!(
        newest(crd("self.name.matches('^[a-z](x)$')", none.clone())).since,
        RULES
    );
    assert_eq!(
        newest(crd("self.v.split('.')[0] == 'a'", none.clone())).since,
        RULES
    );
    assert_eq!(
        newest(crd(
            "quantity(self.size).isGreaterThan(quantity('1'))",
            none.clone()
        ))
        .since,
        (1, 29)
    );
    assert_eq!(
        newest(crd("self.?a.orValue(1) == 1", none.clone())).since,
        (1, 29)
    );
    assert_eq!(
        newest(crd("sets.contains(self.a, ['x'])", none.clone())).since,
        (1, 30)
    );
    assert_eq!(
        newest(crd("self.sets.contains('x')", none.clone())).since,
        RULES
    );
    assert_eq!(
        newest(crd(
            "!format.dns1123Label().validate(self.n).hasValue()",
            none.clone()
        ))
        .since,
        (1, 32)
    );
    assert_eq!(
        newest(crd("self.m.all(k, v, v > 0)", none.clone())).since,
        (1, 33)
    );
    assert_eq!(newest(crd("isSemver(self.v)", none.clone())).since, (1, 34));
    assert_eq!(
        newest(crd("!has(self.namespace)", none.clone())).since,
        (1, 32)
    );
    assert_eq!(
        newest(crd("!has(self.__namespace__)", none.clone())).since,
        RULES
    );
    assert_eq!(
        newest(crd(
            "self == oldSelf",
            serde_json::json!({"fieldPath": ".a"})
        ))
        .since,
        (1, 28)
    );
    assert_eq!(
        newest(crd(
            "self == oldSelf",
            serde_json::json!({"optionalOldSelf": true})
        ))
        .since,
        (1, 30)
    );
    // A string literal is not code; an unknown function or field is an error naming it.
    assert_eq!(
        newest(crd(
            "self.a == 'isSemver(x)' && self.b == \"sets.contains(y)\"",
            none.clone()
        ))
        .since,
        RULES
    );
    let unknown = needs_of(&[crd("self.a.frobnicate()", none.clone())]).unwrap_err();
    assert!(
        unknown.contains("`frobnicate` is not in FUNCTIONS"),
        "{unknown}"
    );
    let unknown = needs_of(&[crd("true", serde_json::json!({"severity": "x"}))]).unwrap_err();
    assert!(unknown.contains("rule field severity"), "{unknown}");
}

#[test]
fn the_floor_parses_helms_spelling() {
    assert_eq!(parse_floor(">=1.29.0-0"), Some((1, 29)));
    assert_eq!(parse_floor(">= v1.30.0"), Some((1, 30)));
    assert_eq!(parse_floor("~1.29"), None);
}

/// Which features decide the floor: printed by `cargo test --test kube_version_floor -- --nocapture`.
#[test]
fn the_features_and_their_versions_are_listed() {
    let mut by_feature: BTreeMap<(Version, String), &'static str> = BTreeMap::new();
    for need in needs_of(&generated_crds()).unwrap() {
        by_feature.insert((need.since, need.feature), need.origin);
    }
    for ((since, feature), origin) in by_feature.iter().rev() {
        println!("{}.{}  {feature}  ({origin})", since.0, since.1);
    }
    assert!(!by_feature.is_empty());
}
