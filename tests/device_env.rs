//! `SOFTROCE_DEVICE` chooses the default device, `SOFTROCE_ENGINE_CPUS`
//! where engine threads run. In a test binary of its own: setting an
//! environment variable while other threads may read the environment is a
//! race, and every other test binary runs tests in parallel; here the tests
//! take turns.

use std::sync::Mutex;

use softroce::verbs::{Device, EngineCpus, Error};

/// Held by each test while it changes or reads the environment.
static ENVIRONMENT: Mutex<()> = Mutex::new(());

#[test]
fn default_device_honours_softroce_device() {
    let _turn = ENVIRONMENT.lock().unwrap_or_else(|e| e.into_inner());
    let first = Device::list().unwrap().remove(0);

    std::env::set_var("SOFTROCE_DEVICE", "sr_lo");
    let chosen = Device::default_device().map(|d| d.name().to_owned());
    std::env::set_var("SOFTROCE_DEVICE", "sr_no_such_interface");
    let missing = Device::default_device();
    std::env::set_var("SOFTROCE_DEVICE", "");
    let empty = Device::default_device().map(|d| d.name().to_owned());
    std::env::remove_var("SOFTROCE_DEVICE");
    let unset = Device::default_device().map(|d| d.name().to_owned());

    assert_eq!(chosen.unwrap(), "sr_lo");
    assert!(matches!(missing, Err(Error::NoSuchDevice { .. })), "{missing:?}");
    assert_eq!(empty.unwrap(), first.name());
    assert_eq!(unset.unwrap(), first.name());
}

#[test]
fn engine_cpus_come_from_softroce_engine_cpus() {
    let _turn = ENVIRONMENT.lock().unwrap_or_else(|e| e.into_inner());
    let read = |value: Option<&str>| {
        match value {
            Some(v) => std::env::set_var(EngineCpus::ENV, v),
            None => std::env::remove_var(EngineCpus::ENV),
        }
        EngineCpus::from_env()
    };
    let (unset, device, opener, wrong) = (read(None), read(Some("device")), read(Some("opener")), read(Some("core0")));
    std::env::remove_var(EngineCpus::ENV);
    assert_eq!(unset, Ok(EngineCpus::Device));
    assert_eq!(device, Ok(EngineCpus::Device));
    assert_eq!(opener, Ok(EngineCpus::Opener));
    let wrong = wrong.unwrap_err();
    assert!(wrong.contains("SOFTROCE_ENGINE_CPUS=core0"), "{wrong}");
}
