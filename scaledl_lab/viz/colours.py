"""The diagrams' colours: forward, backward, and a collective's traffic."""

FORWARD, BACKWARD, COLLECTIVE = "#4C72B0", "#DD8452", "#55A868"
