from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from compute.core.fields import id_field


class ProvisionState(models.TextChoices):
    """A joined machine: adopting -> adopted. A bare-metal machine enrolled by its BMC
    first walks enrolled -> verifying -> manageable -> inspecting -> available, then
    deploying -> deployed (its OS's agent joined) -> adopted (acceptance passed), and back
    through undeploying -> available; a failed step stays `*-failed` with its reason."""

    ADOPTING = "adopting"
    ADOPTED = "adopted"
    ACCEPTANCE_FAILED = "acceptance-failed"
    RETIRED = "retired"
    ENROLLED = "enrolled"
    VERIFYING = "verifying"
    VERIFY_FAILED = "verify-failed"
    MANAGEABLE = "manageable"
    INSPECTING = "inspecting"
    INSPECT_FAILED = "inspect-failed"
    AVAILABLE = "available"
    DEPLOYING = "deploying"
    DEPLOY_FAILED = "deploy-failed"
    DEPLOYED = "deployed"
    UNDEPLOYING = "undeploying"
    UNDEPLOY_FAILED = "undeploy-failed"


class NodeRole(models.TextChoices):
    NODE = "node"  # a machine whose capacity is booked
    PROVISIONER = "provisioner"  # a site's agent that speaks Redfish to the machines' BMCs


class Connectivity(models.TextChoices):
    UNKNOWN = "unknown"
    CONNECTED = "connected"
    UNREACHABLE = "unreachable"


class Health(models.TextChoices):
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"


class Node(models.Model):
    """A machine in a pool.

    Host vCPUs and memory are guarded counters: `*_allocated` is what live allocations and
    sandboxes hold, and a CHECK keeps it within the machine's size, so a GPU reservation's
    host share and a sandbox can never take what the other holds.
    """

    id = id_field("node")
    pool = models.ForeignKey("fleet.Pool", on_delete=models.PROTECT, related_name="nodes",
                             db_index=False)  # indexed with the id (Meta.indexes)
    site = models.ForeignKey("fleet.Site", on_delete=models.PROTECT, related_name="nodes")
    hostname = models.CharField(max_length=253, blank=True)
    role = models.CharField(max_length=16, choices=NodeRole.choices, default=NodeRole.NODE)
    provision_state = models.CharField(max_length=24, choices=ProvisionState.choices,
                                       default=ProvisionState.ADOPTING)
    connectivity = models.CharField(max_length=16, choices=Connectivity.choices,
                                    default=Connectivity.UNKNOWN)
    health = models.CharField(max_length=16, choices=Health.choices, default=Health.HEALTHY)
    cordoned = models.BooleanField(default=False)
    labels = models.JSONField(default=dict, blank=True)
    simulated_root = models.CharField(
        max_length=300, blank=True,
        help_text="A simulated machine's private root (empty: a real machine).")
    vcpus = models.PositiveIntegerField(default=0)
    virtualization = models.CharField(
        max_length=8, blank=True,
        help_text="How the node runs sandbox VMs: kvm, tcg (emulated), none; as it reports.")
    memory_gib = models.PositiveIntegerField(default=0)
    profile = models.JSONField(default=dict, blank=True, help_text=(
        "The profile's units as the node last reported them: {generation, units: {name: "
        "{state, reason, generation, at}}}."))
    vcpus_allocated = models.PositiveIntegerField(default=0)
    memory_gib_allocated = models.PositiveIntegerField(default=0)
    serial = models.CharField(max_length=128, blank=True)
    product_uuid = models.CharField(max_length=64, blank=True)
    macs = ArrayField(models.CharField(max_length=17), default=list, blank=True)
    inventory_generation = models.PositiveIntegerField(default=0)
    session_epoch = models.PositiveBigIntegerField(
        default=0, help_text="Bumped by each new agent session; older sessions cannot act.")
    journal_epoch = models.PositiveBigIntegerField(
        default=0, help_text="The agent journal's epoch; a new one means the journal was lost.")
    agent_version = models.CharField(max_length=64, blank=True, db_default="",
                                     help_text="The version its agent said in its last Hello.")
    gateway = models.CharField(max_length=100, blank=True, db_default="",
                               help_text="The gateway that opened its last session (its name).")
    agent_refused = models.CharField(
        max_length=300, blank=True, db_default="",
        help_text="Why its agent's last session was refused (its version); empty once taken.")
    inventory_refused = models.CharField(
        max_length=300, blank=True, db_default="",
        help_text="Why its last inventory report was refused (a device another node holds, "
                  "another GPU model); empty once a report is taken.")
    key_pin = models.CharField(max_length=80, blank=True,
                               help_text="SPKI pin of the node's key (from its join CSR).")
    public_key = models.TextField(blank=True, help_text="The node key's public half (PEM): "
                                  "what verifies the reports it signs.")
    certificate_not_after = models.DateTimeField(null=True, blank=True)
    acceptance = models.JSONField(default=dict, blank=True,
                                  help_text="The last acceptance attempt and its results.")
    created_at = models.DateTimeField(default=timezone.now)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    connected_at = models.DateTimeField(
        null=True, blank=True, help_text="When it last came back (a session opened, or a "
        "heartbeat after it was unreachable): a binding's timeout counts from then.")
    bmc_address = models.CharField(
        max_length=300, blank=True,
        help_text="redfish+https://HOST/redfish/v1/Systems/ID (empty: enrolled by joining). "
                  "Its credentials are sealed under the KEK as `bmc:<node id>`.")
    bmc_verify = models.JSONField(default=dict, blank=True,
                                  help_text="How the BMC's TLS is checked: {} (system CAs), "
                                            "{caPem} or {insecure: true}.")
    bmc_reachable = models.BooleanField(null=True, blank=True,
                                        help_text="Whether the BMC answered the last command.")
    power_state = models.CharField(max_length=16, blank=True,
                                   help_text="As the BMC last said (On, Off).")
    provision_error = models.TextField(blank=True, help_text="Why the last provision step "
                                                             "failed.")
    provision_command = models.CharField(max_length=32, blank=True,
                                         help_text="The command of the provision step running.")
    deployment = models.JSONField(
        default=dict, blank=True,
        help_text="The last deploy: image, ramdisk, boot device, join token, deadline.")
    bmc_polled_at = models.DateTimeField(null=True, blank=True,
                                         help_text="When the BMC's power state was last asked.")

    class Meta:
        ordering = ["id"]
        constraints = [
            models.CheckConstraint(condition=Q(vcpus_allocated__lte=F("vcpus")),
                                   name="fleet_node_vcpus_within_size"),
            models.CheckConstraint(condition=Q(memory_gib_allocated__lte=F("memory_gib")),
                                   name="fleet_node_memory_within_size"),
            models.UniqueConstraint(
                fields=["bmc_address"], name="fleet_node_one_enrolment_per_bmc",
                condition=~Q(bmc_address="") & ~Q(provision_state=ProvisionState.RETIRED)),
        ]
        # A pool's nodes in id order: the placer's first untouched nodes of a big pool are
        # the first entries here, not a sort of the whole pool (with a second index on the
        # pool alone, Postgres may take that one and sort).
        indexes = [models.Index(fields=["pool", "id"], name="fleet_node_pool_in_order")]

    def __str__(self) -> str:
        return f"{self.hostname or self.id}"

    @property
    def bmc_tls(self) -> str:
        """How the BMC's certificate is checked: system (CAs), ca (a pinned bundle) or
        insecure."""
        verify = self.bmc_verify or {}
        return "insecure" if verify.get("insecure") else "ca" if verify.get("caPem") else "system"

    @property
    def schedulable(self) -> bool:
        return (self.provision_state == ProvisionState.ADOPTED and not self.cordoned
                and self.role == NodeRole.NODE
                and self.connectivity != Connectivity.UNREACHABLE
                and self.health == Health.HEALTHY)


SCHEDULABLE = Q(provision_state=ProvisionState.ADOPTED, cordoned=False, health=Health.HEALTHY,
                role=NodeRole.NODE) & ~Q(connectivity=Connectivity.UNREACHABLE)
