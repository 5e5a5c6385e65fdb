"""Party mode: several data owners train one model; their data stays home, only masked sums travel.

:mod:`~prbmrm.party.session` runs a party, :mod:`~prbmrm.party.secure` aggregates with pairwise
masks, :mod:`~prbmrm.party.keys` holds long-term keys and the roster, :mod:`~prbmrm.party.guard`
checks each aggregated plane, :mod:`~prbmrm.party.privacy` adds differential privacy.
"""
