//! The virtual nodes' addresses and ports: `LEAF_NODE_IP`, `PREFERRED_ADDRESS_TYPE`,
//! `NODE_NAME_PREFIX`, `NODE_PORTS`.

use std::net::IpAddr;

use super::vars::Vars;
use crate::model::names::check_dns_subdomain_prefix;

/// The address types kube-apiserver understands in `--kubelet-preferred-address-types`.
pub const ADDRESS_TYPES: [&str; 5] = [
    "Hostname",
    "InternalDNS",
    "InternalIP",
    "ExternalDNS",
    "ExternalIP",
];

/// `NODE_PORTS` unless set: the chart's `nodeServer.nodePorts` default too.
pub const DEFAULT_NODE_PORTS: u16 = 1000;

/// `LEAF_NODE_IP`: required, the pod IP.
pub(super) fn leaf_node_ip(vars: &mut Vars<'_>) -> IpAddr {
    match vars.get("LEAF_NODE_IP") {
        None => {
            vars.error(
                "LEAF_NODE_IP",
                "required: set it to the pod IP (downward API status.podIP)",
            );
            IpAddr::from([0, 0, 0, 0])
        }
        Some(raw) => vars.parse("LEAF_NODE_IP", &raw, IpAddr::from([0, 0, 0, 0]), |v| {
            v.parse::<IpAddr>()
                .map_err(|_| format!("{v:?} is not an IP address"))
        }),
    }
}

/// `PREFERRED_ADDRESS_TYPE` (or Kosmos' `PREFERRED-ADDRESS-TYPE`).
pub(super) fn preferred_address_type(vars: &mut Vars<'_>) -> String {
    // Kosmos spells it with dashes, which most shells cannot export; accept both.
    let (address_var, address_raw) = match vars.get("PREFERRED-ADDRESS-TYPE") {
        Some(v) => ("PREFERRED-ADDRESS-TYPE", Some(v)),
        None => ("PREFERRED_ADDRESS_TYPE", vars.get("PREFERRED_ADDRESS_TYPE")),
    };

    match address_raw {
        None => "InternalDNS".to_string(),
        Some(raw) => vars.parse(address_var, &raw, String::new(), |v| {
            ADDRESS_TYPES
                .iter()
                .find(|t| t.eq_ignore_ascii_case(v))
                .map(|t| t.to_string())
                .ok_or_else(|| format!("{v:?} is not one of {}", ADDRESS_TYPES.join(", ")))
        }),
    }
}

/// `NODE_NAME_PREFIX`.
pub(super) fn node_name_prefix(vars: &mut Vars<'_>) -> String {
    let node_name_prefix = vars
        .get("NODE_NAME_PREFIX")
        .unwrap_or_else(|| "relaylet-".to_string());
    if !node_name_prefix.is_empty()
        && let Err(message) = check_dns_subdomain_prefix(&node_name_prefix)
    {
        vars.error("NODE_NAME_PREFIX", &message);
    }
    node_name_prefix
}

/// `NODE_PORTS`: every virtual node gets a listener of its own on the first free port above
/// `NODE_SERVER_PORT` (`node_server::node_ports`) on the replica that writes its Node, so this is
/// the most virtual nodes one replica serves at once. The chart's NetworkPolicy opens exactly
/// this range, from the same value.
pub(super) fn node_ports(vars: &mut Vars<'_>, node_server_port: u16) -> u16 {
    let Some(raw) = vars.get("NODE_PORTS") else {
        return DEFAULT_NODE_PORTS;
    };
    vars.parse("NODE_PORTS", &raw, DEFAULT_NODE_PORTS, |v| {
        let n = v
            .parse::<u16>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| format!("{v:?} is not a whole number 1-65535"))?;
        // NODE_SERVER_PORT=0 picks its port at start; the search stops at 65535 then.
        if node_server_port != 0 && node_server_port.checked_add(n).is_none() {
            return Err(format!(
                "{n} ports above NODE_SERVER_PORT={node_server_port} go past 65535"
            ));
        }
        Ok(n)
    })
}
