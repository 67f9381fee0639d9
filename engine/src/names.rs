//! One name table per setting enum: [`names!`](crate::names!) writes each variant's name once
//! and derives from it how the value is written (`as_str`, `Display`), read (`parse`,
//! `FromStr`, so clap reads it as a flag) and what a wrong value is told to use.

/// Whether a setting's names are read with their ASCII case ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Case {
    /// `Topology-Aware` is not `topology-aware`.
    Exact,
    /// `NRI`, `nri` and `Nri` are one name.
    Ignored,
}

impl Case {
    /// Whether `given` (already trimmed) is `name` under this rule.
    pub fn matches(self, given: &str, name: &str) -> bool {
        match self {
            Case::Exact => given == name,
            Case::Ignored => given.eq_ignore_ascii_case(name),
        }
    }
}

/// `a`, `a or b`, `a, b or c`.
pub fn one_of(names: &[&str]) -> String {
    match names {
        [] => String::new(),
        [only] => (*only).to_string(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    }
}

/// A setting enum with a name table ([`names!`](crate::names!) implements it).
pub trait Named: Sized + 'static {
    /// The name each variant is written as, in the table's order.
    const NAMES: &'static [&'static str];
    /// The variant `s` names (surrounding white space ignored).
    fn parse(s: &str) -> Option<Self>;
}

/// The names of `T`, as a sentence (`a, b or c`).
pub fn one_of_names<T: Named>() -> String {
    one_of(T::NAMES)
}

/// A value that is none of a setting's names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {value:?}: use {}", one_of(.names))]
pub struct UnknownName {
    /// What the setting is, e.g. `resource policy`.
    pub what: &'static str,
    pub value: String,
    /// The names it is written as.
    pub names: &'static [&'static str],
}

/// Defines a fieldless enum from one table (each variant with its name, then any other names
/// it is read from) and writes `as_str`, `parse`, `ALL` and `NAMES`, `Display` and `FromStr`
/// for it. Without `enum`, writes them for an enum defined elsewhere.
///
/// ```
/// tap_engine::names! {
///     /// A switch.
///     #[derive(Debug, Clone, Copy, PartialEq, Eq)]
///     pub enum Switch: "switch", Ignored {
///         On = "on" | "true",
///         /// Off.
///         Off = "off" | "false",
///     }
/// }
/// assert_eq!(Switch::parse(" TRUE "), Some(Switch::On));
/// assert_eq!(Switch::Off.to_string(), "off");
/// let e = "maybe".parse::<Switch>().unwrap_err();
/// assert_eq!(e.to_string(), r#"unknown switch "maybe": use on or off"#);
/// ```
#[macro_export]
macro_rules! names {
    (
        $(#[$meta:meta])*
        $vis:vis enum $ty:ident : $what:literal, $case:ident {
            $($(#[$vmeta:meta])* $variant:ident = $name:literal $(| $alias:literal)*),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis enum $ty {
            $($(#[$vmeta])* $variant),+
        }

        $crate::names! {
            $ty: $what, $case {
                $($variant = $name $(| $alias)*),+
            }
        }
    };
    ($ty:ident : $what:literal, $case:ident {
        $($variant:ident = $name:literal $(| $alias:literal)*),+ $(,)?
    }) => {
        impl $ty {
            /// Every variant, in the order of its name table.
            pub const ALL: [$ty; [$(stringify!($variant)),+].len()] = [$($ty::$variant),+];
            /// The name each variant is written as, in the same order.
            pub const NAMES: &'static [&'static str] = &[$($name),+];

            pub fn as_str(self) -> &'static str {
                match self {
                    $($ty::$variant => $name),+
                }
            }

            /// The variant `s` names (surrounding white space ignored).
            pub fn parse(s: &str) -> Option<$ty> {
                let s = s.trim();
                let case = $crate::names::Case::$case;
                $(
                    if case.matches(s, $name) $(|| case.matches(s, $alias))* {
                        return Some($ty::$variant);
                    }
                )+
                None
            }
        }

        impl $crate::names::Named for $ty {
            const NAMES: &'static [&'static str] = $ty::NAMES;
            fn parse(s: &str) -> Option<$ty> {
                $ty::parse(s)
            }
        }

        impl ::std::fmt::Display for $ty {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl ::std::str::FromStr for $ty {
            type Err = $crate::names::UnknownName;
            fn from_str(s: &str) -> Result<$ty, $crate::names::UnknownName> {
                $ty::parse(s).ok_or_else(|| $crate::names::UnknownName {
                    what: $what,
                    value: s.to_string(),
                    names: $ty::NAMES,
                })
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_read_as_a_sentence() {
        assert_eq!(one_of(&["a"]), "a");
        assert_eq!(one_of(&["a", "b"]), "a or b");
        assert_eq!(one_of(&["a", "b", "c"]), "a, b or c");
    }
}
