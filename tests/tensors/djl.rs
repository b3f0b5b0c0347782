//! Scenarios from DJL's own test suites for `NDManager` and resource management, ported to
//! ndmem's scopes (semantics §4).
//!
//! Each test names the DJL test it comes from. DJL's `NDManager` maps onto [`Scope`]:
//! `newBaseManager` is [`Scope::new_base`], `newSubManager` is [`Scope::child`],
//! `NDArray.attach/detach/tempAttach` are [`Scope::attach`], [`Scope::detach`] and
//! [`Scope::temp_attach_all`], `getManagedArrays().size()` is [`Scope::tensor_count`] (owned
//! tensors of that scope only: borrowed ones are in [`Scope::debug_dump`]), and
//! `isReleased()` is `!is_valid()`. Where ndmem deliberately differs (an error value
//! instead of an exception, Rust ownership instead of `close()` on one array), the test
//! asserts ndmem's contract and says so. Scenarios about a particular engine or the Java
//! garbage collector are not ported.
//!
//! Byte checks read a pool of the test's own ([`crate::private`]), so the tests run in
//! parallel.

use std::time::{Duration, Instant};

use ndmem::{reclaim, DType, Error, MemorySource, Scope, Tensor};

use crate::{live, private};

/// Collects until `source`'s pool holds `expected` live bytes (another test's thread may be
/// pinned for a moment, holding frees back); returns what is live after ten seconds.
fn settle_to(source: &MemorySource, expected: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        reclaim::collect();
        let live = live(source);
        if live == expected || Instant::now() > deadline {
            return live;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Whether `err` is `ScopeClosed` naming `scope`.
fn closed_naming(err: &Error, scope: &str) -> bool {
    matches!(err, Error::ScopeClosed { scope: s, .. } if s == scope)
}

/// Whether `err` is `ScopeCapped` naming `scope`.
fn capped_naming(err: &Error, scope: &str) -> bool {
    matches!(err, Error::ScopeCapped { scope: s } if s == scope)
}

// ---- NDArrayAttachmentTest (integration), ManagerAttachmentTest (MXNet, PyTorch) -------

/// DJL `NDArrayAttachmentTest.testReturnResource` (and the engines'
/// `ManagerAttachmentTest.testReturnResource`): an array temp-attached to another base
/// manager belongs to it until it closes, then is back with its first manager, alive.
#[test]
fn temp_attach_returns_the_tensor_to_its_manager_when_the_borrower_closes() {
    let source = private(None);
    let manager = Scope::new_base_in("manager", source);
    let array3x4 = manager.ones(DType::F32, &[3, 4]).unwrap();
    let block = live(&source); // 48 bytes, as the pool rounds them
    assert!(block >= 48);
    {
        let sub_manager = Scope::new_base_in("sub-manager", source);
        sub_manager.temp_attach_all(&[&array3x4]).unwrap();
        // array3x4.getManager() == subManager
        assert_eq!(manager.tensor_count(), 0, "lent out");
        assert!(
            sub_manager
                .debug_dump()
                .contains("[sub-manager]: 0 tensors, 0 bytes (+1 borrowed, 48 bytes)"),
            "{}",
            sub_manager.debug_dump()
        );
        assert_eq!(array3x4.to_vec::<f32>().unwrap(), vec![1.0; 12]);
        // try-with-resources: the handle's drop closes the sub-manager.
    }
    // array3x4.getManager() == manager
    assert_eq!(manager.tensor_count(), 1, "given back");
    assert_eq!(manager.bytes(), 48);
    assert!(array3x4.is_valid(), "not released by the borrower's close");
    assert_eq!(live(&source), block);
    manager.close().unwrap();
    assert!(!array3x4.is_valid(), "released with its manager");
    assert_eq!(settle_to(&source, 0), 0);
}

/// DJL `NDArrayAttachmentTest.testIndexationUsesSpecificManager`: an op's output belongs to
/// the manager of its input; one made for another manager belongs to that one, and is
/// released with it while the input lives on. ndmem has no op taking a target scope: the
/// output is attached to it (`Scope::attach`), which is what DJL's overload does.
#[test]
fn op_outputs_belong_to_the_first_input_scope_or_the_one_they_are_attached_to() {
    let manager = Scope::new_base("indexed");
    let array3x4 = manager.ones(DType::F32, &[3, 4]).unwrap();
    let array4 = array3x4.sum_axis(0).unwrap(); // array3x4.get(1), a new array
    assert_eq!(manager.tensor_count(), 2, "array4.getManager() == manager");
    let sub1;
    {
        let sub_manager = Scope::new_base("specific");
        sub1 = array3x4.mul_scalar(2.0).unwrap();
        sub_manager.attach(&sub1).unwrap();
        assert_eq!(sub_manager.tensor_count(), 1);
        assert_eq!(manager.tensor_count(), 2, "moved out of the input's scope");
        // An op whose first input the sub-manager owns goes to the sub-manager, whatever
        // owns the second input.
        let sub2 = sub1.add(&array3x4).unwrap();
        assert_eq!(sub_manager.tensor_count(), 2);
        assert_eq!(manager.tensor_count(), 2);
        assert_eq!(sub2.to_vec::<f32>().unwrap(), vec![3.0; 12]);
    }
    assert!(!sub1.is_valid(), "released with the sub-manager");
    assert_eq!(array4.to_vec::<f32>().unwrap(), vec![3.0; 4]);
    assert_eq!(array3x4.to_vec::<f32>().unwrap(), vec![1.0; 12]);
}

/// DJL `NDArrayAttachmentTest.testCannotUseCappedManager`: creating in a capped manager
/// fails (DJL: `IllegalStateException`; ndmem: `Error::ScopeCapped`), before any memory is
/// taken.
#[test]
fn creating_in_a_capped_scope_is_scope_capped_and_allocates_nothing() {
    let source = private(None);
    let manager = Scope::new_base_in("capped", source);
    manager.cap();
    let attempts = [
        manager.ones(DType::F32, &[3, 4]),
        manager.zeros(DType::F32, &[3, 4]),
        manager.full(DType::I64, &[3, 4], 7.0),
        manager.from_slice(&[1.0f32, 2.0], &[2]),
    ];
    for attempt in attempts {
        let err = attempt.unwrap_err();
        assert!(capped_naming(&err, "capped"), "{err}");
    }
    assert_eq!(manager.tensor_count(), 0);
    assert_eq!(
        settle_to(&source, 0),
        0,
        "nothing allocated, nothing leaked"
    );
    assert!(manager.debug_dump().contains("capped"));
}

/// DJL `NDArrayAttachmentTest.testIndexationCannotUseCappedManager`: once the manager is
/// capped, an op on one of its arrays (whose output would join it) fails; the array itself
/// stays usable and the failed output leaves no memory behind.
#[test]
fn an_op_on_a_tensor_of_a_capped_scope_is_scope_capped() {
    let source = private(None);
    let manager = Scope::new_base_in("capped-ops", source);
    let array3x4 = manager.ones(DType::F32, &[3, 4]).unwrap();
    let block = live(&source);
    manager.cap();
    let err = array3x4.sum_axis(0).unwrap_err();
    assert!(capped_naming(&err, "capped-ops"), "{err}");
    assert!(array3x4.add_scalar(1.0).is_err());
    assert!(array3x4.copy().is_err(), "a copy would join the scope too");
    assert_eq!(manager.tensor_count(), 1);
    assert_eq!(array3x4.to_vec::<f32>().unwrap(), vec![1.0; 12]);
    assert_eq!(settle_to(&source, block), block, "only array3x4 is live");
}

/// Semantics §4: in a capped scope a `reshape` is a view, and so allocates nothing, when
/// the elements are in row-major order whatever the strides of axes of length 1 (a
/// transposed column, a row broadcast to one more axis); only a reshape that must copy
/// (a transposed matrix) is refused.
#[test]
fn a_capped_scope_reshapes_row_major_views_without_copying() {
    let source = private(None);
    let manager = Scope::new_base_in("capped-reshape", source);
    let column = manager.from_slice(&[1.0f32, 2.0, 3.0], &[3, 1]).unwrap();
    let row = manager.from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
    let matrix = manager.ones(DType::F32, &[2, 3]).unwrap();
    let blocks = live(&source);
    manager.cap();
    let flat = column.transpose().unwrap().reshape(&[3]).unwrap();
    assert_eq!(flat.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0]);
    let again = row.broadcast_to(&[1, 3]).unwrap().reshape(&[3]).unwrap();
    assert_eq!(again.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0]);
    assert_eq!(live(&source), blocks, "no copy was made");
    let err = matrix.transpose().unwrap().reshape(&[6]).unwrap_err();
    assert!(capped_naming(&err, "capped-reshape"), "{err}");
    assert_eq!(manager.tensor_count(), 3);
}

/// DJL `NDArrayAttachmentTest.testIndexationUsesSpecificUncappedManager`: an array of a
/// capped manager can still be borrowed by an uncapped one (and ops on it then go to the
/// borrower); when the borrower closes, the array goes back to its capped manager (a give
/// back is not an attach, DJL's `attachUncappedInternal`).
#[test]
fn a_capped_scope_lends_its_tensors_and_takes_them_back() {
    let manager = Scope::new_base("capped-lender");
    let array3x4 = manager.ones(DType::F32, &[3, 4]).unwrap();
    manager.cap();
    let out;
    {
        let sub_manager = Scope::new_base("uncapped-borrower");
        sub_manager.temp_attach_all(&[&array3x4]).unwrap();
        out = array3x4.mul_scalar(3.0).unwrap(); // array3x4.get(subManager, 1)
        assert_eq!(
            sub_manager.tensor_count(),
            1,
            "the output joins the borrower"
        );
        assert_eq!(out.to_vec::<f32>().unwrap(), vec![3.0; 12]);
    }
    assert!(!out.is_valid(), "released with the borrower");
    assert_eq!(manager.tensor_count(), 1, "back with its capped manager");
    assert_eq!(array3x4.to_vec::<f32>().unwrap(), vec![1.0; 12]);
    let err = manager.attach(&Tensor::ones(DType::F32, &[1]).unwrap());
    assert!(capped_naming(&err.unwrap_err(), "capped-lender"));
}

// ---- NDScopeTest ------------------------------------------------------------------------

/// DJL `NDScopeTest.testNDScope`: an array detached from its manager outlives the
/// manager's close; one still managed is released by it. DJL's `uninvolved.close()` frees
/// one array at once; in ndmem dropping the last handle of a scope-owned tensor leaves it
/// to the scope (Rust ownership: the scope owns it until it closes), which is asserted.
#[test]
fn a_detached_tensor_outlives_its_scope_and_a_managed_one_is_released() {
    let source = private(None);
    let detached;
    let inside;
    {
        let manager = Scope::new_base_in("nd-scope", source);
        let uninvolved = manager.from_slice(&[1i32], &[1]).unwrap();
        drop(uninvolved);
        assert_eq!(manager.tensor_count(), 1, "the scope still owns it");
        inside = manager.from_slice(&[1i32], &[1]).unwrap();
        detached = manager.from_slice(&[1i32], &[1]).unwrap();
        manager.detach(&detached).unwrap();
        assert!(inside.is_valid(), "!inside.isReleased()");
        assert_eq!(manager.tensor_count(), 2, "uninvolved and inside");
    }
    assert!(!inside.is_valid(), "inside.isReleased()");
    assert!(detached.is_valid(), "!detached.isReleased()");
    assert_eq!(detached.to_vec::<i32>().unwrap(), vec![1]);
    // Blocks are at least 16 bytes: `detached` is the only one left.
    let one = live(&source);
    assert!(one > 0);
    drop(detached); // detached.close()
    assert_eq!(settle_to(&source, 0), 0);
}

/// DJL `NDScopeTest.testNDScopeNotVerboseIfResourceAlreadyClosed`: using an array after its
/// manager closed fails (DJL: "Native resource has been released already."); in ndmem an
/// in-place op or a read gives `Error::ScopeClosed` naming the op, the argument and the
/// scope.
#[test]
fn using_a_tensor_after_its_scope_closed_is_scope_closed_naming_it() {
    let manager = Scope::new_base("released");
    let mut nd_array = manager.from_slice(&[1i32], &[1]).unwrap();
    manager.close().unwrap();
    let one = Tensor::from_slice(&[1i32], &[1]).unwrap();
    let err = nd_array.scaled_add(1.0, &one).unwrap_err(); // ndArray.addi(1)
    assert!(closed_naming(&err, "released"), "{err}");
    assert_eq!(
        err.to_string(),
        "Op [scaled_add] X argument belongs to scope [released], which is closed"
    );
    let err = one.add(&nd_array).unwrap_err();
    assert!(closed_naming(&err, "released"), "{err}");
    assert!(err.to_string().contains("Y argument"), "{err}");
    assert!(closed_naming(
        &nd_array.to_vec::<i32>().unwrap_err(),
        "released"
    ));
}

// ---- BaseNDManagerTest ------------------------------------------------------------------

/// DJL `BaseNDManagerTest.testValidateBufferIntegerOverflow` and
/// `testCreate2DIntegerOverflow`: a byte count that overflows must be rejected, not wrap to
/// a small (or zero) size. ndmem: `Error::Shape`, nothing allocated, nothing owned.
#[test]
fn shapes_whose_byte_count_overflows_are_rejected_not_wrapped() {
    let source = private(None);
    let manager = Scope::new_base_in("overflow", source);
    // 4 * 2^62 == 2^64 wraps to exactly 0; (2^62 + 4) * 4 wraps to 16.
    let wrapping: [(DType, &[usize]); 5] = [
        (DType::F32, &[1 << 62]),
        (DType::F32, &[(1 << 62) + 4]),
        (DType::F64, &[1 << 61]),
        (DType::F32, &[1 << 32, 1 << 32]), // elements wrap to 0
        (DType::F32, &[1 << 16, 1 << 14, 1 << 32]),
    ];
    for (dtype, shape) in wrapping {
        let err = manager.zeros(dtype, shape).unwrap_err();
        assert!(matches!(err, Error::Shape { .. }), "{shape:?}: {err}");
        let err = Tensor::zeros_in(&source, dtype, shape).unwrap_err();
        assert!(matches!(err, Error::Shape { .. }), "{shape:?}: {err}");
    }
    // from_slice compares the element count with the data: a wrapped count of 0 or 4
    // must not match an empty or a four-element slice.
    let err = manager
        .from_slice::<f32>(&[], &[1 << 32, 1 << 32])
        .unwrap_err();
    assert!(matches!(err, Error::Shape { .. }), "{err}");
    let err = manager
        .from_slice(&[0.0f32; 4], &[(1 << 62) + 4])
        .unwrap_err();
    assert!(matches!(err, Error::Shape { .. }), "{err}");
    let err = manager
        .from_slice(&[0.0f64; 4], &[usize::MAX, 2])
        .unwrap_err();
    assert!(matches!(err, Error::Shape { .. }), "{err}");
    assert_eq!(manager.tensor_count(), 0);
    assert_eq!(live(&source), 0);
}

/// DJL `BaseNDManagerTest.testValidateBufferRejectsUndersized` and
/// `testValidateBufferAcceptsExactSize`: too few values for the shape are rejected; the
/// exact number is accepted unchanged. **Decision (ndmem):** too many values are an error
/// too, where DJL logs a warning and truncates.
#[test]
fn from_slice_takes_exactly_the_shape_worth_of_values() {
    let manager = Scope::new_base("buffers");
    let tiny = [0.0f32; 4]; // 16 bytes
    let err = manager.from_slice(&tiny, &[1000]).unwrap_err();
    assert!(matches!(err, Error::Shape { .. }), "{err}");
    let err = manager.from_slice(&tiny, &[3]).unwrap_err();
    assert!(matches!(err, Error::Shape { .. }), "{err}");
    assert_eq!(manager.tensor_count(), 0);

    let exact = [1.0f32, 2.0, 3.0, 4.0];
    let t = manager.from_slice(&exact, &[4]).unwrap();
    assert_eq!(manager.bytes(), 16);
    assert_eq!(t.to_vec::<f32>().unwrap(), exact.to_vec());
}

/// DJL `BaseNDManagerTest.testValidateBufferRejectsMismatchedWidth`: elements of another
/// width than the data type are rejected. In Rust the element type of `from_slice` sets the
/// dtype, so the mismatch that can happen is reading with another element type:
/// `Error::DType`, for wider, narrower and same-width types alike.
#[test]
fn reading_with_another_element_type_is_a_dtype_error() {
    let manager = Scope::new_base("widths");
    let longs = manager.from_slice(&[1i64, 2, 3, 4], &[4]).unwrap();
    assert_eq!(longs.dtype(), DType::I64);
    assert!(matches!(longs.to_vec::<i32>(), Err(Error::DType { .. })));
    assert!(matches!(longs.to_vec::<f64>(), Err(Error::DType { .. })));
    let floats = manager.from_slice(&[1.0f32; 4], &[4]).unwrap();
    assert!(matches!(floats.to_vec::<i32>(), Err(Error::DType { .. })));
    assert!(matches!(floats.view::<f64>(), Err(Error::DType { .. })));
    assert_eq!(longs.to_vec::<i64>().unwrap(), vec![1, 2, 3, 4]);
}

// ---- PassthroughNDManagerTest -----------------------------------------------------------

/// DJL `PassthroughNDManagerTest.testPassthrough` (its manager part): a sub-manager can be
/// made and closed while the manager stays open, another follows, and the manager owns no
/// arrays. **Decision (ndmem):** a capped scope refuses new tensors (the passthrough
/// manager ignores `cap()`).
#[test]
fn a_closed_sub_scope_leaves_its_parent_open_and_another_can_follow() {
    let manager = Scope::new_base("passthrough");
    let sub = manager.child("first").unwrap();
    sub.close().unwrap();
    assert!(!manager.is_closed(), "manager.isOpen()");
    let sub = manager.child("second").unwrap();
    assert_eq!(manager.tensor_count(), 0, "getManagedArrays().isEmpty()");
    let dump = manager.debug_dump();
    assert!(!dump.contains("[first]"), "{dump}");
    assert!(
        dump.contains("  scope [second]: 0 tensors, 0 bytes"),
        "{dump}"
    );
    manager.cap();
    assert!(capped_naming(
        &manager.zeros(DType::F32, &[1]).unwrap_err(),
        "passthrough"
    ));
    assert!(
        sub.zeros(DType::F32, &[1]).is_ok(),
        "a child is not capped with its parent"
    );
}

// ---- PyTorch engine gc/Main (the debugDump scenario; the GC part has no meaning here) ---

/// DJL PyTorch `integration/gc/Main`: a sub-manager's arrays, an op's output among them,
/// show in the dump of its base manager with their count (and, in ndmem, their bytes);
/// closing the sub-manager releases them and removes it from the dump.
#[test]
fn debug_dump_shows_a_sub_scope_with_its_tensors_until_it_closes() {
    let source = private(None);
    let base_manager = Scope::new_base_in("gc-base", source);
    let (a, c);
    {
        let sub_manager = base_manager.child("gc-sub").unwrap();
        a = sub_manager.from_slice(&[1.0f32], &[1]).unwrap();
        let b = sub_manager.from_slice(&[2.0f32], &[1]).unwrap();
        c = a.add(&b).unwrap();
        assert_eq!(c.to_vec::<f32>().unwrap(), vec![3.0]);
        let dump = base_manager.debug_dump();
        assert!(
            dump.starts_with("scope [gc-base]: 0 tensors, 0 bytes\n"),
            "{dump}"
        );
        assert!(
            dump.contains("\n  scope [gc-sub]: 3 tensors, 12 bytes\n"),
            "{dump}"
        );
        assert!(Scope::root().debug_dump().contains("[gc-sub]"));
    }
    let dump = base_manager.debug_dump();
    assert_eq!(dump, "scope [gc-base]: 0 tensors, 0 bytes\n");
    assert!(!Scope::root().debug_dump().contains("[gc-sub]"));
    assert!(!a.is_valid() && !c.is_valid());
    assert_eq!(settle_to(&source, 0), 0);
}

// ---- BaseNDManager's resource contract (attach, tempAttach, detach, close) ---------------

/// DJL `BaseNDManager.attachUncappedInternal` / `tempAttachInternal` (exercised by the
/// attachment tests): attaching or temp-attaching to a closed manager fails
/// (`IllegalStateException("NDManager has been closed already.")`; ndmem:
/// `Error::ScopeClosed`), and the tensor stays with its owner.
#[test]
fn attaching_or_borrowing_into_a_closed_scope_is_scope_closed() {
    let owner = Scope::new_base("still-open");
    let t = owner.ones(DType::F32, &[2]).unwrap();
    let closed = owner.child("shut").unwrap();
    let grandchild = closed.child("shut-below").unwrap();
    closed.close().unwrap();
    assert!(grandchild.is_closed());
    assert!(closed_naming(
        &grandchild.attach(&t).unwrap_err(),
        "shut-below"
    ));
    assert!(closed_naming(
        &grandchild.temp_attach_all(&[&t]).unwrap_err(),
        "shut-below"
    ));
    assert!(closed_naming(
        &grandchild.child("late").unwrap_err(),
        "shut-below"
    ));
    assert_eq!(owner.tensor_count(), 1, "t stays with its owner");
    assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.0; 2]);
    grandchild.close().unwrap(); // closing again is harmless, as in DJL
}

/// DJL `BaseNDManager.detachInternal` marks a temp resource detached so the borrower's
/// close does not give it back: an array detached while borrowed belongs to nobody
/// afterwards and outlives both managers.
#[test]
fn a_tensor_detached_while_borrowed_is_not_given_back() {
    let owner = Scope::new_base("lender");
    let t = owner.ones(DType::F32, &[2]).unwrap();
    let borrower = Scope::new_base("borrower");
    borrower.temp_attach_all(&[&t]).unwrap();
    borrower.detach(&t).unwrap();
    borrower.close().unwrap();
    assert_eq!(owner.tensor_count(), 0, "not given back");
    owner.close().unwrap();
    assert_eq!(
        t.to_vec::<f32>().unwrap(),
        vec![1.0; 2],
        "its handles own it"
    );
}

/// DJL `BaseNDManager.attachUncappedInternal`'s comment: manager A temp-attaches a resource
/// that manager B later temp-attaches; when B closes it goes back to A *as A's borrowed
/// resource*, and to its owner when A closes.
#[test]
fn nested_borrows_unwind_in_order() {
    let owner = Scope::new_base("owner");
    let t = owner.ones(DType::F32, &[4]).unwrap();
    let a = Scope::new_base("man-a");
    let b = Scope::new_base("man-b");
    a.temp_attach_all(&[&t]).unwrap();
    b.temp_attach_all(&[&t]).unwrap();
    assert!(b.debug_dump().contains("(+1 borrowed, 16 bytes)"));
    assert!(!a.debug_dump().contains("borrowed"));
    b.close().unwrap();
    assert!(
        a.debug_dump()
            .contains("[man-a]: 0 tensors, 0 bytes (+1 borrowed, 16 bytes)"),
        "{}",
        a.debug_dump()
    );
    assert_eq!(owner.tensor_count(), 0, "still lent to A");
    a.close().unwrap();
    assert_eq!(owner.tensor_count(), 1, "back home");
    assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.0; 4]);
}

/// The same chain, with the middle borrower closing first: the tensor skips it and goes
/// back to its owner (DJL: `TempResource.returnResource` to a manager that is not open).
#[test]
fn a_borrow_whose_lender_closed_first_goes_back_further() {
    let owner = Scope::new_base("first-owner");
    let t = owner.ones(DType::F32, &[4]).unwrap();
    let a = Scope::new_base("middle");
    let b = Scope::new_base("last");
    a.temp_attach_all(&[&t]).unwrap();
    b.temp_attach_all(&[&t]).unwrap();
    a.close().unwrap();
    assert!(t.is_valid(), "b holds it");
    b.close().unwrap();
    assert_eq!(owner.tensor_count(), 1);
    assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.0; 4]);
}

/// DJL `TempResource.returnResource`: if the original manager closed while the array was
/// borrowed, the array is closed when the borrower closes; until then it lives (the
/// original manager's close does not release what it lent).
#[test]
fn a_borrowed_tensor_whose_owner_closed_is_freed_with_the_borrower() {
    let source = private(None);
    let owner = Scope::new_base_in("gone-owner", source);
    let t = owner.ones(DType::F32, &[4]).unwrap();
    let borrower = Scope::new_base_in("keeper", source);
    borrower.temp_attach_all(&[&t]).unwrap();
    owner.close().unwrap();
    assert!(t.is_valid(), "lent out: not released by its owner's close");
    assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.0; 4]);
    borrower.close().unwrap();
    assert!(!t.is_valid(), "released: nobody to give it back to");
    drop(t);
    assert_eq!(settle_to(&source, 0), 0);
}

/// DJL `NDArray.attach(manager)` between base managers: the new manager owns the array
/// and releases it; the old one no longer does.
#[test]
fn attach_moves_a_tensor_between_base_scopes_and_only_the_new_owner_releases_it() {
    let first = Scope::new_base("from");
    let second = Scope::new_base("to");
    let t = first.ones(DType::F64, &[2]).unwrap();
    second.attach(&t).unwrap();
    assert_eq!((first.tensor_count(), second.tensor_count()), (0, 1));
    first.close().unwrap();
    assert!(t.is_valid());
    second.close().unwrap();
    assert!(closed_naming(&t.to_vec::<f64>().unwrap_err(), "to"));
}

/// DJL `SystemNDManager`: the system manager cannot be closed (ndmem: `Error::Scope`), and
/// closing a base manager closes its sub-managers and releases their arrays.
#[test]
fn the_root_cannot_close_and_a_base_scope_closes_its_whole_tree() {
    let err = Scope::root().close().unwrap_err();
    assert!(matches!(err, Error::Scope { .. }), "{err}");
    let base = Scope::new_base("tree");
    let sub = base.child("branch").unwrap();
    let leaf = sub.child("leaf").unwrap();
    let t = leaf.ones(DType::U8, &[3]).unwrap();
    base.close().unwrap();
    assert!(sub.is_closed() && leaf.is_closed());
    assert!(closed_naming(&t.to_vec::<u8>().unwrap_err(), "leaf"));
    leaf.close().unwrap();
}

/// DJL `BaseNDManager.tempAttachInternal`: "System manager cannot be temp attached because
/// it can't be closed". ndmem's root never closes either, so a borrow by it would never be
/// given back: it is `Error::Scope`, and the tensor stays with its owner (which still
/// frees it).
#[test]
fn the_root_cannot_borrow_because_it_never_gives_back() {
    let owner = Scope::new_base("lends-to-root");
    let t = owner.ones(DType::F32, &[4]).unwrap();
    let err = Scope::root().temp_attach_all(&[&t]).unwrap_err();
    assert!(
        matches!(&err, Error::Scope { scope, .. } if scope == "root"),
        "{err}"
    );
    assert_eq!(owner.tensor_count(), 1, "still its owner's");
    assert!(!Scope::root()
        .debug_dump()
        .lines()
        .next()
        .unwrap()
        .contains("borrowed"));
    owner.close().unwrap();
    assert!(!t.is_valid(), "freed with its owner, not kept by the root");
}

/// DJL `NDScopeTest.testNDScope`'s `uninvolved.close()`: one array freed before its
/// manager closes. ndmem has no `close` on a tensor: detaching it from its scope and
/// dropping the last handle frees it at once (through reclamation).
#[test]
fn detaching_and_dropping_frees_one_tensor_before_its_scope_closes() {
    let source = private(None);
    let manager = Scope::new_base_in("early-free", source);
    let kept = manager.ones(DType::F32, &[256]).unwrap();
    let kept_bytes = live(&source);
    let uninvolved = manager.ones(DType::F32, &[1024]).unwrap();
    assert!(live(&source) > kept_bytes);
    manager.detach(&uninvolved).unwrap();
    drop(uninvolved);
    assert_eq!(settle_to(&source, kept_bytes), kept_bytes, "freed at once");
    assert_eq!(manager.tensor_count(), 1);
    assert_eq!(kept.to_vec::<f32>().unwrap(), vec![1.0; 256]);
}

/// DJL `NDManager.tempAttachAll(NDResource...)` (as DJL users call it on a batch's arrays):
/// every array is borrowed, or none is. ndmem: one array already freed by its closed scope
/// makes the call fail with `Error::ScopeClosed` and borrows nothing.
#[test]
fn temp_attach_all_of_a_list_is_all_or_nothing() {
    let owner = Scope::new_base("list-owner");
    let a = owner.ones(DType::F32, &[2]).unwrap();
    let b = owner.ones(DType::F32, &[3]).unwrap();
    let gone = {
        let short_lived = Scope::new_base("short-lived");
        short_lived.ones(DType::F32, &[1]).unwrap()
    };
    let borrower = Scope::new_base("list-borrower");
    let err = borrower.temp_attach_all(&[&a, &gone, &b]).unwrap_err();
    assert!(closed_naming(&err, "short-lived"), "{err}");
    assert_eq!(owner.tensor_count(), 2, "nothing borrowed");
    assert!(!borrower.debug_dump().contains("borrowed"));
    borrower.temp_attach_all(&[&a, &b]).unwrap();
    assert_eq!(owner.tensor_count(), 0);
    assert!(borrower.debug_dump().contains("(+2 borrowed, 20 bytes)"));
    borrower.close().unwrap();
    assert_eq!(owner.tensor_count(), 2);
}

/// DJL `BaseNDManager.attachInternal` / `detachInternal` are `synchronized`: arrays moved
/// between managers from several threads are never lost or owned twice. Threads attach,
/// borrow and detach the same tensors between three scopes; afterwards each tensor is
/// owned by exactly one scope or by its handles, and closing frees exactly what the scopes
/// own.
#[test]
fn concurrent_transfers_never_lose_or_double_a_tensor() {
    let source = private(None);
    let scopes: Vec<Scope> = (0..3)
        .map(|i| Scope::new_base_in(&format!("race-{i}"), source))
        .collect();
    let tensors: Vec<Tensor> = (0..16)
        .map(|i| scopes[i % 3].full(DType::F32, &[4], i as f64).unwrap())
        .collect();
    std::thread::scope(|s| {
        for worker in 0..4usize {
            let scopes = &scopes;
            let tensors = &tensors;
            s.spawn(move || {
                for step in 0..300usize {
                    let t = &tensors[(worker * 7 + step) % tensors.len()];
                    let scope = &scopes[(worker + step) % 3];
                    let _ = match step % 4 {
                        0 | 1 => scope.attach(t),
                        2 => scope.temp_attach_all(&[t]),
                        _ => scope.detach(t),
                    };
                }
            });
        }
    });
    let owned: usize = scopes.iter().map(Scope::tensor_count).sum();
    let borrowed: usize = scopes
        .iter()
        .map(|s| {
            let dump = s.debug_dump();
            dump.split("(+")
                .nth(1)
                .map_or(0, |rest| rest.split(' ').next().unwrap().parse().unwrap())
        })
        .sum();
    assert!(owned + borrowed <= tensors.len(), "{owned} + {borrowed}");
    // Each tensor is held by at most one scope: attaching it to one scope takes it from
    // any other, so after every scope attaches it the last one alone owns it.
    for t in &tensors {
        for scope in &scopes {
            scope.attach(t).unwrap();
        }
    }
    assert_eq!(scopes[2].tensor_count(), tensors.len());
    assert_eq!(scopes[0].tensor_count() + scopes[1].tensor_count(), 0);
    for scope in scopes {
        scope.close().unwrap();
    }
    assert!(tensors.iter().all(|t| !t.is_valid()));
    drop(tensors);
    assert_eq!(settle_to(&source, 0), 0, "every block freed once");
}

/// The DJL pattern behind `tempAttachAll` (its javadoc, and how DJL's blocks use it): a
/// sub-manager borrows its parent's inputs, computes, hands the result to the parent
/// (`attachAll`) and closes: the inputs go back to the parent, the intermediates are
/// freed, the result stays. If the parent closes first, the borrowed inputs are freed with
/// the sub-manager (their owner is closed).
#[test]
fn a_sub_scope_borrowing_its_parents_inputs_frees_only_the_intermediates() {
    let source = private(None);
    let output_manager = Scope::new_base_in("outputs", source);
    let x = output_manager.full(DType::F32, &[256], 2.0).unwrap();
    let w = output_manager.full(DType::F32, &[256], 3.0).unwrap();
    let inputs = live(&source);
    let result;
    {
        let scope = output_manager.child("step").unwrap();
        scope.temp_attach_all(&[&x, &w]).unwrap();
        let h = x.mul(&w).unwrap(); // joins the borrower, like x
        let intermediate = h.add_scalar(1.0).unwrap();
        result = intermediate.sum().unwrap();
        assert_eq!(scope.tensor_count(), 3);
        output_manager.attach(&result).unwrap();
        assert_eq!(scope.tensor_count(), 2);
        scope.close().unwrap();
        assert!(!h.is_valid() && !intermediate.is_valid());
    }
    assert_eq!(output_manager.tensor_count(), 3, "x, w and the result");
    assert_eq!(result.scalar().unwrap(), 7.0 * 256.0);
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![2.0; 256]);
    // What one scalar's block costs, measured in a pool of its own.
    let scalar_pool = private(None);
    let scalar = Tensor::zeros_in(&scalar_pool, DType::F32, &[]).unwrap();
    let result_block = live(&scalar_pool);
    drop(scalar);
    assert_eq!(
        settle_to(&source, inputs + result_block),
        inputs + result_block,
        "the intermediates' blocks went back to the pool"
    );

    // The parent closing while the sub-manager still borrows: everything is freed.
    let scope = output_manager.child("late-step").unwrap();
    scope.temp_attach_all(&[&x]).unwrap();
    output_manager.close().unwrap();
    assert!(scope.is_closed());
    assert!(!x.is_valid() && !w.is_valid() && !result.is_valid());
    drop((x, w, result));
    assert_eq!(settle_to(&source, 0), 0);
}

// ---- BaseNDManager.SystemManager: the root tracks nothing -----------------------------

/// DJL's system manager tracks nothing it is given (`attachInternal` does nothing), so an
/// array on it is freed when nothing refers to it. ndmem's root never closes: a tensor it
/// recorded, and every op output on it (an output belongs to its first input's scope),
/// would be kept for the life of the process. What goes to the root is its handles'.
#[test]
fn the_root_keeps_nothing_so_op_outputs_on_its_tensors_free_when_dropped() {
    let source = private(None);
    let base = Scope::new_base_in("to-root", source);
    let weights = {
        let w = base.ones(DType::F32, &[1024]).unwrap();
        base.ret(&w).unwrap()
    };
    let block = live(&source);
    assert_eq!(base.tensor_count(), 0, "returned to the root");
    assert_eq!(Scope::root().tensor_count(), 0, "the root records nothing");
    for step in 0..100 {
        let y = weights.add_scalar(step as f64).unwrap();
        assert_eq!(y.to_vec::<f32>().unwrap()[0], 1.0 + step as f32);
    }
    assert_eq!(settle_to(&source, block), block, "every output freed");
    base.close().unwrap();
    assert_eq!(
        weights.to_vec::<f32>().unwrap(),
        vec![1.0; 1024],
        "not the base's"
    );
    drop(weights);
    assert_eq!(settle_to(&source, 0), 0, "freed with its last handle");
}

#[test]
fn attaching_to_the_root_takes_a_tensor_from_its_scope_and_gives_it_to_its_handles() {
    let source = private(None);
    let base = Scope::new_base_in("attach-root", source);
    let t = base.full(DType::F64, &[8], 2.5).unwrap();
    Scope::root().attach(&t).unwrap();
    assert_eq!((base.tensor_count(), Scope::root().tensor_count()), (0, 0));
    Scope::root()
        .detach(&t)
        .expect("a tensor no scope owns is already its handles'");
    base.close().unwrap();
    assert_eq!(t.to_vec::<f64>().unwrap(), vec![2.5; 8]);
    drop(t);
    assert_eq!(settle_to(&source, 0), 0);
    // The root created in scope-less fashion too: a root tensor is freed with its handles.
    let r = Scope::root().zeros(DType::F32, &[4]).unwrap();
    assert_eq!(Scope::root().tensor_count(), 0);
    let other = Scope::new_base("owns-it");
    other.attach(&r).unwrap();
    assert_eq!(
        other.tensor_count(),
        1,
        "a root tensor can be attached elsewhere"
    );
    let err = Scope::root().detach(&r).unwrap_err();
    assert!(
        matches!(&err, Error::Scope { scope, .. } if scope == "root"),
        "{err}"
    );
}

/// DJL `NDManager.ret`: `resource.attach(getParentManager())`, whoever owns it.
#[test]
fn ret_hands_any_tensor_to_the_parent_as_djl_attaches_it() {
    let source = private(None);
    let parent = Scope::new_base_in("ret-parent", source);
    let child = parent.child("ret-child").unwrap();
    let free = Tensor::zeros_in(&source, DType::F32, &[4]).unwrap();
    child.ret(&free).unwrap();
    assert_eq!(parent.tensor_count(), 1, "from its handles to the parent");
    let parents = parent.zeros(DType::F32, &[4]).unwrap();
    child.ret(&parents).unwrap();
    assert_eq!(
        parent.tensor_count(),
        2,
        "the parent's already: it stays there"
    );
    let elsewhere = Scope::new_base_in("ret-elsewhere", source);
    let theirs = elsewhere.zeros(DType::F32, &[4]).unwrap();
    child.ret(&theirs).unwrap();
    assert_eq!((elsewhere.tensor_count(), parent.tensor_count()), (0, 3));
    elsewhere.close().unwrap();
    assert!(theirs.is_valid(), "the parent's now");
    parent.cap();
    let late = Tensor::zeros_in(&source, DType::F32, &[4]).unwrap();
    assert!(capped_naming(&child.ret(&late).unwrap_err(), "ret-parent"));
    parent.close().unwrap();
    assert!(!free.is_valid() && !parents.is_valid() && !theirs.is_valid());
    assert!(
        late.is_valid(),
        "a refused ret leaves the tensor where it was"
    );
}

#[test]
fn a_closed_scope_asked_to_take_or_open_something_names_itself_not_an_argument() {
    let scope = Scope::new_base("closed-taker");
    let child = scope.child("closed-child").unwrap();
    scope.close().unwrap();
    let fresh = Tensor::zeros(DType::F32, &[2]).unwrap();
    let err = child.attach(&fresh).unwrap_err();
    assert!(closed_naming(&err, "closed-child"), "{err}");
    assert_eq!(
        err.to_string(),
        "Op [attach]: scope [closed-child] is closed"
    );
    let err = child.child("x").unwrap_err();
    assert_eq!(
        err.to_string(),
        "Op [child]: scope [closed-child] is closed"
    );
    let err = child.zeros(DType::F32, &[2]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "Op [zeros]: scope [closed-child] is closed"
    );
    assert!(fresh.is_valid(), "not the closed scope's");
}
