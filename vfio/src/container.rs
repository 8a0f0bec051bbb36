//! VFIO containers and groups, and DMA mappings in a container's IOMMU
//! domain.
//!
//! A [`Container`] is `/dev/vfio/vfio`: an IOMMU address space. Groups
//! (`/dev/vfio/N`, one per IOMMU group) join it; once the first has joined,
//! the type1 IOMMU is selected. Devices are opened through their group
//! ([`Container::open_device`]). DMA mappings ([`Container::map_dma`]) make
//! memory of this process — a [`DmaBuffer`](crate::bar::DmaBuffer) of RAM, or
//! a [`BarWindow`](crate::bar::BarWindow) of another device's BAR (a
//! peer-to-peer IOVA) — reachable by the container's devices at an IOVA.
//!
//! Ownership makes teardown order hold on every path, errors included:
//! a DMA mapping holds the memory it maps and the container; a region
//! mapping holds its device; a device holds its group; a group holds the
//! container. So dropping, in whatever order the caller drops things, runs
//! unmap DMA → munmap regions → close the device → unset the container →
//! close the group → close the container. A handle half-built when a step
//! fails is dropped the same way (a group whose `SET_CONTAINER` failed is
//! not unset).

use std::fmt;
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use crate::bind;
use crate::env::VfioEnv;
use crate::error::VfioError;
use crate::sys::region::Region;
use crate::sys::{
    DMA_MAP_FLAG_READ, DMA_MAP_FLAG_WRITE, Errno, GROUP_FLAGS_VIABLE, RawIommuInfo,
    VFIO_API_VERSION, VFIO_TYPE1_IOMMU, VFIO_TYPE1V2_IOMMU,
};

/// Which IOMMU backend a container uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IommuType {
    /// `VFIO_TYPE1v2_IOMMU`.
    Type1v2,
    /// `VFIO_TYPE1_IOMMU`.
    Type1,
}

impl IommuType {
    fn raw(self) -> u32 {
        match self {
            IommuType::Type1v2 => VFIO_TYPE1V2_IOMMU,
            IommuType::Type1 => VFIO_TYPE1_IOMMU,
        }
    }
}

pub(crate) struct ContainerInner {
    pub(crate) env: VfioEnv,
    pub(crate) fd: RawFd,
    path: PathBuf,
    /// The backend the kernel offers (checked at open).
    iommu_type: IommuType,
    /// Whether `SET_IOMMU` was done (after the first group joined).
    state: Mutex<ContainerState>,
}

#[derive(Default)]
struct ContainerState {
    iommu_set: bool,
    groups: Vec<Weak<GroupInner>>,
}

impl fmt::Debug for ContainerInner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Container")
            .field("path", &self.path)
            .field("fd", &self.fd)
            .field("iommu_type", &self.iommu_type)
            .finish_non_exhaustive()
    }
}

impl Drop for ContainerInner {
    fn drop(&mut self) {
        self.env.sys.close(self.fd);
    }
}

pub(crate) struct GroupInner {
    pub(crate) id: u32,
    pub(crate) fd: RawFd,
    path: PathBuf,
    /// Whether `SET_CONTAINER` succeeded (and so must be undone).
    attached: bool,
    /// Dropped after `unset`/`close` (fields drop after the body).
    pub(crate) container: Arc<ContainerInner>,
}

impl fmt::Debug for GroupInner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Group")
            .field("id", &self.id)
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl Drop for GroupInner {
    fn drop(&mut self) {
        let sys = &self.container.env.sys;
        if self.attached {
            // Fails only if the group was never set, which `attached` rules
            // out; nothing else could be done about it here.
            let _ = sys.group_unset_container(self.fd);
        }
        sys.close(self.fd);
    }
}

/// A VFIO container: one IOMMU address space shared by the devices opened
/// in it. Cheap to clone (a shared handle).
#[derive(Debug, Clone)]
pub struct Container {
    pub(crate) inner: Arc<ContainerInner>,
}

impl Container {
    /// Opens `/dev/vfio/vfio` and checks the API version and that a type1
    /// IOMMU backend exists.
    pub fn open() -> Result<Container, VfioError> {
        Container::open_in(VfioEnv::default())
    }

    /// [`Container::open`] in another environment (fixture roots, a mock).
    pub fn open_in(env: VfioEnv) -> Result<Container, VfioError> {
        let path = env.dev_dir.join("vfio");
        let fd = match env.sys.open(&path) {
            Ok(fd) => fd,
            Err(Errno(libc::ENOENT | libc::ENODEV)) => return Err(VfioError::NoVfio { path }),
            Err(errno) if errno.is_permission() => {
                return Err(VfioError::PermissionDenied { path, errno });
            }
            Err(errno) => {
                return Err(VfioError::System {
                    operation: "open",
                    target: path.display().to_string(),
                    errno,
                });
            }
        };
        // From here on, dropping `inner` closes the descriptor.
        let mut inner = ContainerInner {
            env,
            fd,
            path,
            iommu_type: IommuType::Type1v2,
            state: Mutex::new(ContainerState::default()),
        };
        let sys = inner.env.sys.clone();
        let version = sys
            .get_api_version(fd)
            .map_err(|errno| inner.system("VFIO_GET_API_VERSION", errno))?;
        if version != VFIO_API_VERSION {
            return Err(VfioError::ApiVersion {
                found: version,
                expected: VFIO_API_VERSION,
            });
        }
        inner.iommu_type = if sys
            .check_extension(fd, VFIO_TYPE1V2_IOMMU)
            .map_err(|errno| inner.system("VFIO_CHECK_EXTENSION", errno))?
        {
            IommuType::Type1v2
        } else if sys
            .check_extension(fd, VFIO_TYPE1_IOMMU)
            .map_err(|errno| inner.system("VFIO_CHECK_EXTENSION", errno))?
        {
            IommuType::Type1
        } else {
            return Err(VfioError::NoIommu {
                detail: "the container offers neither type1 nor type1v2".to_string(),
            });
        };
        Ok(Container {
            inner: Arc::new(inner),
        })
    }

    /// The environment the container was opened in.
    pub fn env(&self) -> &VfioEnv {
        &self.inner.env
    }

    /// The IOMMU backend.
    pub fn iommu_type(&self) -> IommuType {
        self.inner.iommu_type
    }

    /// The group `id` in this container, opened and joined if need be.
    pub(crate) fn group(&self, id: u32) -> Result<Arc<GroupInner>, VfioError> {
        let mut state = self
            .inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        state.groups.retain(|g| g.strong_count() > 0);
        if let Some(group) = state
            .groups
            .iter()
            .filter_map(Weak::upgrade)
            .find(|g| g.id == id)
        {
            return Ok(group);
        }
        let env = &self.inner.env;
        let sys = &env.sys;
        let path = env.dev_dir.join(id.to_string());
        let fd = match sys.open(&path) {
            Ok(fd) => fd,
            Err(Errno(libc::ENOENT)) => {
                return Err(VfioError::GroupNodeMissing { group: id, path });
            }
            Err(Errno(libc::EBUSY)) => return Err(VfioError::GroupBusy { group: id, path }),
            Err(errno) if errno.is_permission() => {
                return Err(VfioError::PermissionDenied { path, errno });
            }
            Err(errno) => {
                return Err(VfioError::System {
                    operation: "open",
                    target: path.display().to_string(),
                    errno,
                });
            }
        };
        // Dropping `group` from here on closes (and, once attached, unsets).
        let mut group = GroupInner {
            id,
            fd,
            path,
            attached: false,
            container: self.inner.clone(),
        };
        let flags = sys
            .group_get_status(fd)
            .map_err(|errno| group.system("VFIO_GROUP_GET_STATUS", errno))?;
        if flags & GROUP_FLAGS_VIABLE == 0 {
            return Err(VfioError::GroupNotViable {
                group: id,
                blockers: bind::group_blockers(&env.sysfs_root, id),
            });
        }
        sys.group_set_container(fd, self.inner.fd)
            .map_err(|errno| group.system("VFIO_GROUP_SET_CONTAINER", errno))?;
        group.attached = true;
        if !state.iommu_set {
            sys.set_iommu(self.inner.fd, self.inner.iommu_type.raw())
                .map_err(|errno| VfioError::NoIommu {
                    detail: format!(
                        "VFIO_SET_IOMMU({:?}) failed: {errno}",
                        self.inner.iommu_type
                    ),
                })?;
            state.iommu_set = true;
        }
        let group = Arc::new(group);
        state.groups.push(Arc::downgrade(&group));
        Ok(group)
    }

    /// `VFIO_IOMMU_GET_INFO`: the IOMMU's page sizes. Needs a device opened
    /// in the container first (the IOMMU is selected then).
    pub fn iommu_info(&self) -> Result<RawIommuInfo, VfioError> {
        self.inner
            .env
            .sys
            .iommu_get_info(self.inner.fd)
            .map_err(|errno| self.inner.system("VFIO_IOMMU_GET_INFO", errno))
    }

    /// Maps all of `memory` (a [`DmaBuffer`](crate::bar::DmaBuffer) or a
    /// [`BarWindow`](crate::bar::BarWindow), whole or sliced) at `iova` for
    /// device reads and writes. The returned mapping keeps the memory
    /// alive, and unmaps when dropped.
    ///
    /// Address, IOVA and length must be page-aligned. Mapping another
    /// device's BAR gives a peer-to-peer IOVA: a device of this container
    /// that writes there writes that BAR.
    pub fn map_dma(&self, iova: u64, memory: &impl DmaTarget) -> Result<DmaMapping, VfioError> {
        let (region, offset, len) = memory.dma_range();
        let fail = |errno: Option<Errno>, hint: String| VfioError::DmaMapFailed {
            iova,
            size: len as u64,
            errno,
            hint,
        };
        if !self
            .inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iommu_set
        {
            return Err(fail(
                None,
                "the container has no IOMMU yet: open a device in it first".into(),
            ));
        }
        let page = crate::sys::page_size() as u64;
        let vaddr = region.address_of(offset);
        if len == 0
            || !iova.is_multiple_of(page)
            || !vaddr.is_multiple_of(page)
            || !(len as u64).is_multiple_of(page)
        {
            return Err(fail(
                Some(Errno(libc::EINVAL)),
                format!(
                    "address {vaddr:#x}, IOVA and length must be non-zero multiples of the \
                     {page}-byte page"
                ),
            ));
        }
        let mut flags = 0;
        if region.prot().read {
            flags |= DMA_MAP_FLAG_READ;
        }
        if region.prot().write {
            flags |= DMA_MAP_FLAG_WRITE;
        }
        region
            .map_dma(self.inner.fd, offset, len, iova, flags)
            .map_err(|errno| {
                let hint = match errno.0 {
                    libc::ENOMEM => "the locked-memory limit is too low: raise it (`ulimit -l`, \
                                     RLIMIT_MEMLOCK, or limits.conf memlock) or run as root"
                        .to_string(),
                    libc::EEXIST => "the IOVA range overlaps an existing mapping".to_string(),
                    libc::EFAULT => "the memory cannot be pinned for DMA".to_string(),
                    libc::EINVAL => "alignment, or an IOVA outside what the IOMMU accepts \
                                     (check VFIO_IOMMU_GET_INFO page sizes and IOVA ranges)"
                        .to_string(),
                    _ => "check dmesg".to_string(),
                };
                fail(Some(errno), hint)
            })?;
        Ok(DmaMapping {
            _memory: region.clone(),
            container: self.inner.clone(),
            iova,
            len: len as u64,
            mapped: true,
        })
    }
}

impl ContainerInner {
    fn system(&self, operation: &'static str, errno: Errno) -> VfioError {
        VfioError::System {
            operation,
            target: self.path.display().to_string(),
            errno,
        }
    }
}

impl GroupInner {
    fn system(&self, operation: &'static str, errno: Errno) -> VfioError {
        VfioError::System {
            operation,
            target: self.path.display().to_string(),
            errno,
        }
    }

    /// The group node.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

pub(crate) mod sealed {
    /// Implemented by the crate's own mappings only (see [`super::DmaTarget`]).
    pub trait Sealed {}
}

/// Memory a container can map for DMA: a [`DmaBuffer`](crate::DmaBuffer)
/// or a [`BarWindow`](crate::BarWindow) (sealed: only this crate's mappings
/// qualify, since the mapping must outlive the IOMMU entry, which
/// [`DmaMapping`] guarantees by holding it).
pub trait DmaTarget: sealed::Sealed {
    #[doc(hidden)]
    fn dma_range(&self) -> (&Arc<Region>, usize, usize);
}

/// Memory mapped at an IOVA in a container's IOMMU; unmapped when dropped
/// (before the memory itself can be unmapped, which it keeps alive).
pub struct DmaMapping {
    // Field order is drop order: the memory goes before the container.
    _memory: Arc<Region>,
    container: Arc<ContainerInner>,
    iova: u64,
    len: u64,
    mapped: bool,
}

impl fmt::Debug for DmaMapping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DmaMapping")
            .field("iova", &format_args!("{:#x}", self.iova))
            .field("len", &format_args!("{:#x}", self.len))
            .finish_non_exhaustive()
    }
}

impl DmaMapping {
    /// The I/O virtual address devices use.
    pub fn iova(&self) -> u64 {
        self.iova
    }

    /// Bytes mapped.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether nothing is mapped (never, for a mapping that exists).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Unmaps now, reporting a failure (dropping unmaps silently).
    pub fn unmap(mut self) -> Result<(), VfioError> {
        self.unmap_now()
    }

    /// Unmaps the whole range, or says why not. On failure the memory is
    /// kept mapped in this process for good (leaked): the device may still
    /// reach it through the IOMMU, so it must never be reused.
    fn unmap_now(&mut self) -> Result<(), VfioError> {
        self.mapped = false;
        let error = |errno, hint: &str| VfioError::DmaMapFailed {
            iova: self.iova,
            size: self.len,
            errno,
            hint: hint.into(),
        };
        let result = match self
            .container
            .env
            .sys
            .unmap_dma(self.container.fd, self.iova, self.len)
        {
            Ok(unmapped) if unmapped == self.len => Ok(()),
            Ok(unmapped) => Err(error(
                None,
                &format!(
                    "VFIO_IOMMU_UNMAP_DMA unmapped {unmapped} of {} bytes",
                    self.len
                ),
            )),
            Err(errno) => Err(error(Some(errno), "VFIO_IOMMU_UNMAP_DMA failed")),
        };
        if result.is_err() {
            std::mem::forget(Arc::clone(&self._memory));
        }
        result
    }
}

impl Drop for DmaMapping {
    fn drop(&mut self) {
        if self.mapped {
            // A failure leaks the memory (see `unmap_now`); nothing else
            // can be done in a destructor.
            let _ = self.unmap_now();
        }
        // `_memory` is released after this, so the device can
        // no longer reach it when it goes; the container after that.
    }
}
