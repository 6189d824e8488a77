//! Quantities with their unit in the type, so memory can never be added to CPU by mistake.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::ops::{Add, AddAssign, Sub, SubAssign};

macro_rules! quantity {
    ($(#[$doc:meta])* $name:ident($inner:ty)) => {
        $(#[$doc])*
        #[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub $inner);

        impl $name {
            pub const ZERO: Self = Self(0);

            /// Subtraction that stops at zero instead of wrapping.
            pub fn saturating_sub(self, other: Self) -> Self {
                Self(self.0.saturating_sub(other.0))
            }

            /// Subtraction that reports underflow as `None`.
            pub fn checked_sub(self, other: Self) -> Option<Self> {
                self.0.checked_sub(other.0).map(Self)
            }
        }

        impl Add for $name {
            type Output = Self;
            fn add(self, other: Self) -> Self {
                Self(self.0 + other.0)
            }
        }

        impl AddAssign for $name {
            fn add_assign(&mut self, other: Self) {
                self.0 += other.0;
            }
        }

        impl Sub for $name {
            type Output = Self;
            fn sub(self, other: Self) -> Self {
                Self(self.0 - other.0)
            }
        }

        impl SubAssign for $name {
            fn sub_assign(&mut self, other: Self) {
                self.0 -= other.0;
            }
        }

        impl std::iter::Sum for $name {
            fn sum<I: Iterator<Item = Self>>(iter: I) -> Self {
                iter.fold(Self::ZERO, Add::add)
            }
        }
    };
}

quantity!(
    /// Memory in mebibytes (GPU memory and host memory alike).
    MiB(u64)
);
quantity!(
    /// CPU in thousandths of a core, as Kubernetes and ECS count it.
    MilliCpu(u64)
);
quantity!(
    /// A share of one GPU's compute (its streaming multiprocessors) in thousandths:
    /// 1000 is the whole GPU. Finer than [`Percent`] so a trace's `gpu_milli` fits exactly.
    ComputeMilli(u32)
);

/// A percentage, 0..=100, as operators write MPS compute caps
/// (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, ECS `maxComputePercent`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "u32", into = "u32")]
pub struct Percent(u8);

/// A percentage above 100.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0} is not a percentage: it must be between 0 and 100")]
pub struct PercentOutOfRange(pub u32);

impl Percent {
    pub fn new(value: u32) -> Result<Self, PercentOutOfRange> {
        if value <= 100 {
            Ok(Percent(value as u8))
        } else {
            Err(PercentOutOfRange(value))
        }
    }

    pub fn get(self) -> u32 {
        u32::from(self.0)
    }

    /// The same share in thousandths of a GPU.
    pub fn to_compute_milli(self) -> ComputeMilli {
        ComputeMilli(u32::from(self.0) * 10)
    }
}

impl TryFrom<u32> for Percent {
    type Error = PercentOutOfRange;
    fn try_from(value: u32) -> Result<Self, Self::Error> {
        Percent::new(value)
    }
}

impl From<Percent> for u32 {
    fn from(p: Percent) -> u32 {
        p.get()
    }
}

impl ComputeMilli {
    pub const FULL: ComputeMilli = ComputeMilli(1000);
}

impl fmt::Display for MiB {
    /// Whole GiB when exact (`24 GiB`), otherwise MiB (`1536 MiB`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 >= 1024 && self.0.is_multiple_of(1024) {
            write!(f, "{} GiB", self.0 / 1024)
        } else {
            write!(f, "{} MiB", self.0)
        }
    }
}

impl fmt::Display for MilliCpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_multiple_of(1000) {
            write!(f, "{} vCPU", self.0 / 1000)
        } else {
            write!(f, "{:.2} vCPU", self.0 as f64 / 1000.0)
        }
    }
}

impl fmt::Display for ComputeMilli {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_multiple_of(10) {
            write!(f, "{}%", self.0 / 10)
        } else {
            write!(f, "{:.1}%", f64::from(self.0) / 10.0)
        }
    }
}

impl fmt::Display for Percent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}%", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mib_displays_whole_gib_and_odd_mib() {
        assert_eq!(MiB(24 * 1024).to_string(), "24 GiB");
        assert_eq!(MiB(1536).to_string(), "1536 MiB");
        assert_eq!(MiB(512).to_string(), "512 MiB");
    }

    #[test]
    fn percent_rejects_values_above_100() {
        assert_eq!(Percent::new(100).map(Percent::get), Ok(100));
        assert_eq!(Percent::new(101), Err(PercentOutOfRange(101)));
        let err = serde_json::from_str::<Percent>("150").expect_err("150 is out of range");
        assert!(err.to_string().contains("between 0 and 100"), "{err}");
    }

    #[test]
    fn percent_converts_to_compute_milli() {
        assert_eq!(
            Percent::new(25).map(Percent::to_compute_milli),
            Ok(ComputeMilli(250))
        );
        assert_eq!(ComputeMilli(460).to_string(), "46%");
        assert_eq!(ComputeMilli(455).to_string(), "45.5%");
    }

    #[test]
    fn saturating_and_checked_sub() {
        assert_eq!(MiB(5).saturating_sub(MiB(9)), MiB(0));
        assert_eq!(MilliCpu(5).checked_sub(MilliCpu(9)), None);
        assert_eq!(MilliCpu(9).checked_sub(MilliCpu(5)), Some(MilliCpu(4)));
    }
}
